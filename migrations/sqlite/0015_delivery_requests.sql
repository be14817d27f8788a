-- What a client asked of delivery beyond the envelope: the DSN parameters (RET, ENVID, and
-- NOTIFY/ORCPT per recipient) and REQUIRETLS, as JSON (`DeliveryRequests::to_stored`).
-- NULL for ordinary mail, so a message without them writes nothing more. Numbered 0015 in
-- both dialects (SQLite has no 0014): migrations are numbered alike from here on.
ALTER TABLE messages ADD COLUMN requests TEXT;
