-- Split transactions (DESIGN §1): a message whose recipients came in several transactions is
-- stored as several records under one key, parts 1, 2, ..., numbered at their first commit by
-- this unique index (it replaces the one on (scope, idem_key)).
ALTER TABLE messages ADD COLUMN part BIGINT NOT NULL DEFAULT 1;
-- The fingerprint without the recipient set: the parts of one message share it. NULL for rows
-- from before parts existed (they accept no further part).
ALTER TABLE messages ADD COLUMN message_fp BYTEA;
-- The key the upstream sees (DESIGN §1), as written into the stored bytes at intake.
ALTER TABLE messages ADD COLUMN upstream_key TEXT;
UPDATE messages SET upstream_key = idem_key;
DROP INDEX messages_scope_key;
CREATE UNIQUE INDEX messages_scope_key_part ON messages (scope, idem_key, part);
