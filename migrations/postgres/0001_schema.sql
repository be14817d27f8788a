-- The Postgres schema: the SQLite migrations 0001-0003 in one step. Times are milliseconds
-- since the Unix epoch taken from the database's clock (idemrelay_now_ms), so that every
-- relay instance judges retention, windows and leases by one clock.
CREATE FUNCTION idemrelay_now_ms() RETURNS BIGINT
    LANGUAGE sql VOLATILE
    AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT $$;

-- One row per submission; the unique index on (scope, idem_key) is the duplicate check.
CREATE TABLE messages (
    id             TEXT    PRIMARY KEY,
    scope          TEXT    NOT NULL,
    idem_key       TEXT,
    key_source     TEXT    NOT NULL,
    fingerprint    BYTEA   NOT NULL,
    mail_from      TEXT    NOT NULL,
    rcpt_to        TEXT    NOT NULL,
    body_type      TEXT    NOT NULL,
    smtputf8       BOOLEAN NOT NULL,
    size           BIGINT  NOT NULL,
    content        BYTEA,
    state          TEXT    NOT NULL
        CHECK (state IN ('queued', 'delivered', 'failed', 'unresolved', 'rejected')),
    reply          TEXT    NOT NULL,
    accepted_at    BIGINT  NOT NULL,
    finished_at    BIGINT,
    upstream_reply TEXT,
    -- A delivery status notification points at the message it reports on.
    dsn_of         TEXT
);

CREATE UNIQUE INDEX messages_scope_key ON messages (scope, idem_key);
CREATE INDEX messages_state_accepted ON messages (state, accepted_at);

-- The delivery job is inserted in the same transaction as its message.
CREATE TABLE delivery_jobs (
    message_id       TEXT   PRIMARY KEY REFERENCES messages (id) ON DELETE CASCADE,
    due_at           BIGINT NOT NULL,
    attempts         BIGINT NOT NULL DEFAULT 0,
    lease_owner      TEXT,
    lease_until      BIGINT,
    first_attempt_at BIGINT,
    -- Fencing token: bumped at every claim and checked by every write of the lease holder.
    lease_token      BIGINT NOT NULL DEFAULT 0
);

CREATE INDEX delivery_jobs_due ON delivery_jobs (due_at);

-- The attempt ledger: a row (the intent) is written before talking to the upstream and
-- completed with the outcome after. An intent left open by a crash becomes 'unknown'.
CREATE TABLE attempts (
    message_id  TEXT   NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    attempt     BIGINT NOT NULL,
    owner       TEXT   NOT NULL,
    started_at  BIGINT NOT NULL,
    finished_at BIGINT,
    outcome     TEXT CHECK (outcome IN ('accepted', 'transient', 'permanent', 'unknown')),
    phase       TEXT,
    code        BIGINT,
    reply       TEXT,
    PRIMARY KEY (message_id, attempt)
);

-- Relay-wide delivery switch: an account-level failure pauses the whole queue.
CREATE TABLE delivery_control (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    paused_at BIGINT,
    reason    TEXT,
    -- true when the relay paused itself and may resume after a normal probe; an operator's
    -- pause waits for the operator.
    probe     BOOLEAN NOT NULL DEFAULT false
);
INSERT INTO delivery_control (id) VALUES (1);

-- Round-robin across scopes: the scope claimed longest ago goes next. A sequence rather
-- than MAX(turn) + 1, so concurrent claims on several instances never wait on each other.
CREATE SEQUENCE scope_turn_seq;
CREATE TABLE scope_turns (
    scope TEXT   PRIMARY KEY,
    turn  BIGINT NOT NULL
);
