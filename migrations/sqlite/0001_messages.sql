-- One row per submission; the unique index on (scope, idem_key) is the duplicate check.
CREATE TABLE messages (
    id             TEXT    PRIMARY KEY,
    scope          TEXT    NOT NULL,
    idem_key       TEXT,
    key_source     TEXT    NOT NULL,
    fingerprint    BLOB    NOT NULL,
    mail_from      TEXT    NOT NULL,
    rcpt_to        TEXT    NOT NULL,
    body_type      TEXT    NOT NULL,
    smtputf8       INTEGER NOT NULL,
    size           INTEGER NOT NULL,
    content        BLOB,
    state          TEXT    NOT NULL
        CHECK (state IN ('queued', 'delivered', 'failed', 'unresolved', 'rejected')),
    reply          TEXT    NOT NULL,
    accepted_at    INTEGER NOT NULL,
    finished_at    INTEGER,
    upstream_reply TEXT
) STRICT;

CREATE UNIQUE INDEX messages_scope_key ON messages (scope, idem_key);
CREATE INDEX messages_state_accepted ON messages (state, accepted_at);

-- The delivery job is inserted in the same transaction as its message.
CREATE TABLE delivery_jobs (
    message_id  TEXT    PRIMARY KEY REFERENCES messages (id) ON DELETE CASCADE,
    due_at      INTEGER NOT NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    lease_owner TEXT,
    lease_until INTEGER
) STRICT;

CREATE INDEX delivery_jobs_due ON delivery_jobs (due_at);
