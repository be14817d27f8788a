-- Upstream events (DESIGN §7); the same schema as SQLite's migration 10. An event names its
-- message by the upstream's id (from the reply to the final dot of an accepted attempt), the
-- key the upstream saw, or the Message-ID header (without angle brackets;
-- `header_message_id`, since `message_id` names the record in the other tables).
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
    source      TEXT   NOT NULL,
    webhook_id  TEXT   NOT NULL,
    received_at BIGINT NOT NULL,
    events      BIGINT NOT NULL,
    PRIMARY KEY (source, webhook_id)
);
CREATE INDEX webhook_receipts_received ON webhook_receipts (received_at);

-- One row per event. record_id is NULL while the event matches no record; applied is false
-- when it was older than the newest event already applied to its record and recipient (or
-- while unmatched); evidence is true on the event that resolved its record.
CREATE TABLE upstream_events (
    seq               BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source            TEXT    NOT NULL,
    webhook_id        TEXT    NOT NULL,
    idx               BIGINT  NOT NULL,
    event_type        TEXT    NOT NULL,
    kind              TEXT    NOT NULL CHECK (kind IN ('accepted', 'bounced', 'other')),
    event_time        BIGINT  NOT NULL,
    received_at       BIGINT  NOT NULL,
    idem_key          TEXT,
    upstream_id       TEXT,
    header_message_id TEXT,
    -- Lower-cased; '' when the event names no recipient.
    recipient         TEXT    NOT NULL DEFAULT '',
    record_id         TEXT    REFERENCES messages (id) ON DELETE CASCADE,
    applied           BOOLEAN NOT NULL DEFAULT false,
    evidence          BOOLEAN NOT NULL DEFAULT false,
    body              TEXT    NOT NULL,
    UNIQUE (source, webhook_id, idx)
);
CREATE INDEX upstream_events_record ON upstream_events (record_id, recipient, event_time)
    WHERE record_id IS NOT NULL;
CREATE INDEX upstream_events_unmatched_key ON upstream_events (idem_key)
    WHERE record_id IS NULL;
CREATE INDEX upstream_events_unmatched_upstream_id ON upstream_events (upstream_id)
    WHERE record_id IS NULL;
CREATE INDEX upstream_events_unmatched_message_id ON upstream_events (header_message_id)
    WHERE record_id IS NULL;
CREATE INDEX upstream_events_unmatched_received ON upstream_events (received_at)
    WHERE record_id IS NULL;

ALTER TABLE daily_counts ADD COLUMN resolved_by_event BIGINT NOT NULL DEFAULT 0;
ALTER TABLE daily_counts ADD COLUMN bounced BIGINT NOT NULL DEFAULT 0;

CREATE FUNCTION idemrelay_count_resolved() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO daily_counts (scope, day, shard, resolved_by_event)
    VALUES (NEW.scope, idemrelay_utc_day(COALESCE(NEW.finished_at, NEW.accepted_at)),
            hashtext(NEW.id) & 7, 1)
    ON CONFLICT (scope, day, shard) DO UPDATE
        SET resolved_by_event = daily_counts.resolved_by_event + 1;
    RETURN NULL;
END
$$;

CREATE TRIGGER daily_counts_resolved_by_event AFTER UPDATE OF state ON messages
    FOR EACH ROW WHEN (OLD.state = 'unresolved' AND NEW.state = 'delivered'
                       AND NEW.resolved_by IS NOT NULL)
    EXECUTE FUNCTION idemrelay_count_resolved();

-- A bounce is counted for its record's scope once it is matched (at receipt or later), on
-- the day it was received.
CREATE FUNCTION idemrelay_count_bounce() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO daily_counts (scope, day, shard, bounced)
    SELECT m.scope, idemrelay_utc_day(NEW.received_at), hashtext(m.id) & 7, 1
    FROM messages m WHERE m.id = NEW.record_id
    ON CONFLICT (scope, day, shard) DO UPDATE SET bounced = daily_counts.bounced + 1;
    RETURN NULL;
END
$$;

CREATE TRIGGER daily_counts_bounce_matched AFTER INSERT ON upstream_events
    FOR EACH ROW WHEN (NEW.kind = 'bounced' AND NEW.record_id IS NOT NULL)
    EXECUTE FUNCTION idemrelay_count_bounce();
CREATE TRIGGER daily_counts_bounce_matched_late AFTER UPDATE OF record_id ON upstream_events
    FOR EACH ROW WHEN (NEW.kind = 'bounced' AND OLD.record_id IS NULL
                       AND NEW.record_id IS NOT NULL)
    EXECUTE FUNCTION idemrelay_count_bounce();
