-- Bodies of 32 KiB and more live in spool segments (see src/store/spool.rs): content is NULL
-- and these say where the body is; its length is the row's size.
ALTER TABLE messages ADD COLUMN spool_segment INTEGER;
ALTER TABLE messages ADD COLUMN spool_offset INTEGER;
-- The spool's garbage collector asks which segments rows still point at.
CREATE INDEX messages_spool_segment ON messages (spool_segment) WHERE spool_segment IS NOT NULL;
