-- Upstream events (DESIGN §7). An event names its message by the upstream's id (from the
-- reply to the final dot of an accepted attempt), the key the upstream saw, or the
-- Message-ID header (without angle brackets; `header_message_id`, since `message_id` names
-- the record in the other tables).
ALTER TABLE messages ADD COLUMN header_message_id TEXT;
-- The upstream event that resolved an unresolved record (`source/webhook-id#index type`).
ALTER TABLE messages ADD COLUMN resolved_by TEXT;
CREATE INDEX messages_upstream_key ON messages (upstream_key) WHERE upstream_key IS NOT NULL;
CREATE INDEX messages_header_message_id ON messages (header_message_id)
    WHERE header_message_id IS NOT NULL;
ALTER TABLE attempts ADD COLUMN upstream_id TEXT;
CREATE INDEX attempts_upstream_id ON attempts (upstream_id) WHERE upstream_id IS NOT NULL;

-- One row per webhook request received: the primary key is the exactly-once constraint.
CREATE TABLE webhook_receipts (
    source      TEXT    NOT NULL,
    webhook_id  TEXT    NOT NULL,
    received_at INTEGER NOT NULL,
    events      INTEGER NOT NULL,
    PRIMARY KEY (source, webhook_id)
) STRICT;
CREATE INDEX webhook_receipts_received ON webhook_receipts (received_at);

-- One row per event. record_id is NULL while the event matches no record; applied is 0 when
-- it was older than the newest event already applied to its record and recipient (or while
-- unmatched); evidence is 1 on the event that resolved its record.
CREATE TABLE upstream_events (
    seq               INTEGER PRIMARY KEY,
    source            TEXT    NOT NULL,
    webhook_id        TEXT    NOT NULL,
    idx               INTEGER NOT NULL,
    event_type        TEXT    NOT NULL,
    kind              TEXT    NOT NULL CHECK (kind IN ('accepted', 'bounced', 'other')),
    event_time        INTEGER NOT NULL,
    received_at       INTEGER NOT NULL,
    idem_key          TEXT,
    upstream_id       TEXT,
    header_message_id TEXT,
    -- Lower-cased; '' when the event names no recipient.
    recipient         TEXT    NOT NULL DEFAULT '',
    record_id         TEXT    REFERENCES messages (id) ON DELETE CASCADE,
    applied           INTEGER NOT NULL DEFAULT 0,
    evidence          INTEGER NOT NULL DEFAULT 0,
    body              TEXT    NOT NULL,
    UNIQUE (source, webhook_id, idx)
) STRICT;
-- The newest applied event per (record, recipient), and a record's events.
CREATE INDEX upstream_events_record ON upstream_events (record_id, recipient, event_time)
    WHERE record_id IS NOT NULL;
-- Unmatched events, looked up when a record becomes known by one of its identifiers.
CREATE INDEX upstream_events_unmatched_key ON upstream_events (idem_key)
    WHERE record_id IS NULL;
CREATE INDEX upstream_events_unmatched_upstream_id ON upstream_events (upstream_id)
    WHERE record_id IS NULL;
CREATE INDEX upstream_events_unmatched_message_id ON upstream_events (header_message_id)
    WHERE record_id IS NULL;
CREATE INDEX upstream_events_unmatched_received ON upstream_events (received_at)
    WHERE record_id IS NULL;

ALTER TABLE daily_counts ADD COLUMN resolved_by_event INTEGER NOT NULL DEFAULT 0;
ALTER TABLE daily_counts ADD COLUMN bounced INTEGER NOT NULL DEFAULT 0;

-- Counted by triggers, like the other daily counts: on the day it happened.
CREATE TRIGGER daily_counts_resolved_by_event AFTER UPDATE OF state ON messages
WHEN OLD.state = 'unresolved' AND NEW.state = 'delivered' AND NEW.resolved_by IS NOT NULL
BEGIN
    INSERT OR IGNORE INTO daily_counts (scope, day)
        VALUES (NEW.scope, date(COALESCE(NEW.finished_at, NEW.accepted_at) / 1000, 'unixepoch'));
    UPDATE daily_counts SET resolved_by_event = resolved_by_event + 1
        WHERE scope = NEW.scope
          AND day = date(COALESCE(NEW.finished_at, NEW.accepted_at) / 1000, 'unixepoch');
END;

-- A bounce is counted for its record's scope once it is matched (at receipt or later), on
-- the day it was received.
CREATE TRIGGER daily_counts_bounce_matched AFTER INSERT ON upstream_events
WHEN NEW.kind = 'bounced' AND NEW.record_id IS NOT NULL
BEGIN
    INSERT OR IGNORE INTO daily_counts (scope, day)
        SELECT scope, date(NEW.received_at / 1000, 'unixepoch') FROM messages
        WHERE id = NEW.record_id;
    UPDATE daily_counts SET bounced = bounced + 1
        WHERE scope = (SELECT scope FROM messages WHERE id = NEW.record_id)
          AND day = date(NEW.received_at / 1000, 'unixepoch');
END;
CREATE TRIGGER daily_counts_bounce_matched_late AFTER UPDATE OF record_id ON upstream_events
WHEN NEW.kind = 'bounced' AND OLD.record_id IS NULL AND NEW.record_id IS NOT NULL
BEGIN
    INSERT OR IGNORE INTO daily_counts (scope, day)
        SELECT scope, date(NEW.received_at / 1000, 'unixepoch') FROM messages
        WHERE id = NEW.record_id;
    UPDATE daily_counts SET bounced = bounced + 1
        WHERE scope = (SELECT scope FROM messages WHERE id = NEW.record_id)
          AND day = date(NEW.received_at / 1000, 'unixepoch');
END;
