-- Every stored body's blake3 checksum, checked before a byte of it is forwarded. NULL only for
-- rows written before this migration (their bodies are not checked).
ALTER TABLE messages ADD COLUMN content_hash BYTEA;
-- Why a record's body could not be used (not matching its checksum). Such a record is
-- failed, never forwarded, and waits for an operator; NULL otherwise.
ALTER TABLE messages ADD COLUMN damage TEXT;
CREATE INDEX messages_damaged ON messages (id) WHERE damage IS NOT NULL;
