-- Every stored body's blake3 checksum, inline or spooled, checked before a byte of it is
-- forwarded. NULL only for rows written before this migration (their bodies are not checked).
ALTER TABLE messages ADD COLUMN content_hash BLOB;
-- Why a record's body could not be used (unreadable, or not matching its checksum). Such a
-- record is failed, never forwarded, and waits for an operator; NULL otherwise.
ALTER TABLE messages ADD COLUMN damage TEXT;
CREATE INDEX messages_damaged ON messages (id) WHERE damage IS NOT NULL;
