-- The attempt ledger: a row (the intent) is written before talking to the upstream and
-- completed with the outcome after. An intent left open by a crash becomes 'unknown'.
CREATE TABLE attempts (
    message_id  TEXT    NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    attempt     INTEGER NOT NULL,
    owner       TEXT    NOT NULL,
    started_at  INTEGER NOT NULL,
    finished_at INTEGER,
    outcome     TEXT CHECK (outcome IN ('accepted', 'transient', 'permanent', 'unknown')),
    phase       TEXT,
    code        INTEGER,
    reply       TEXT,
    PRIMARY KEY (message_id, attempt)
) STRICT;

ALTER TABLE delivery_jobs ADD COLUMN first_attempt_at INTEGER;

-- A delivery status notification points at the message it reports on.
ALTER TABLE messages ADD COLUMN dsn_of TEXT;

-- Relay-wide delivery switch: an account-level failure pauses the whole queue.
CREATE TABLE delivery_control (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    paused_at INTEGER,
    reason    TEXT,
    -- 1 when the relay paused itself and may resume after a normal probe; an operator's
    -- pause waits for the operator.
    probe     INTEGER NOT NULL DEFAULT 0
) STRICT;
INSERT INTO delivery_control (id) VALUES (1);

-- Round-robin across scopes: the scope claimed longest ago goes next.
CREATE TABLE scope_turns (
    scope TEXT    PRIMARY KEY,
    turn  INTEGER NOT NULL
) STRICT;
