-- Operator tools (issue 15): a `cancelled` state of its own, the operator actions table, and
-- indexes for the queue filters.
ALTER TABLE messages DROP CONSTRAINT messages_state_check;
ALTER TABLE messages ADD CONSTRAINT messages_state_check
    CHECK (state IN ('queued', 'delivered', 'failed', 'unresolved', 'rejected', 'cancelled'));

-- Cancelled records are counted on their own (they were `failed` before this migration).
ALTER TABLE daily_counts ADD COLUMN cancelled BIGINT NOT NULL DEFAULT 0;

CREATE OR REPLACE FUNCTION idemrelay_count_finished() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO daily_counts (scope, day, shard, delivered, failed, unresolved, cancelled)
    VALUES (NEW.scope, idemrelay_utc_day(COALESCE(NEW.finished_at, NEW.accepted_at)),
            hashtext(NEW.id) & 7, (NEW.state = 'delivered')::INT, (NEW.state = 'failed')::INT,
            (NEW.state = 'unresolved')::INT, (NEW.state = 'cancelled')::INT)
    ON CONFLICT (scope, day, shard) DO UPDATE SET
        delivered = daily_counts.delivered + excluded.delivered,
        failed = daily_counts.failed + excluded.failed,
        unresolved = daily_counts.unresolved + excluded.unresolved,
        cancelled = daily_counts.cancelled + excluded.cancelled;
    RETURN NULL;
END
$$;

DROP TRIGGER daily_counts_finished ON messages;
CREATE TRIGGER daily_counts_finished AFTER UPDATE OF state ON messages
    FOR EACH ROW WHEN (NEW.state IN ('delivered', 'failed', 'unresolved', 'cancelled')
                       AND OLD.state <> NEW.state)
    EXECUTE FUNCTION idemrelay_count_finished();

-- Finding a message (`queue list` filters). Ids begin with their acceptance time, so paging
-- and time ranges walk an id index; sender and recipient filters scan (see the README).
CREATE INDEX messages_scope_id ON messages (scope, id);
CREATE INDEX messages_state_id ON messages (state, id);
CREATE INDEX messages_key ON messages (idem_key) WHERE idem_key IS NOT NULL;
-- A DSN's link back to the record it reports on.
CREATE INDEX messages_dsn_of ON messages (dsn_of) WHERE dsn_of IS NOT NULL;

-- Every operator action (pause, resume, cancel, retry, flush, purge): who and why. record_id
-- is NULL for actions on the whole relay.
CREATE TABLE operator_actions (
    seq       BIGSERIAL PRIMARY KEY,
    at        BIGINT NOT NULL,
    record_id TEXT   REFERENCES messages (id) ON DELETE CASCADE,
    action    TEXT   NOT NULL,
    actor     TEXT   NOT NULL,
    reason    TEXT   NOT NULL,
    detail    TEXT
);
CREATE INDEX operator_actions_record ON operator_actions (record_id, seq)
    WHERE record_id IS NOT NULL;
CREATE INDEX operator_actions_relay ON operator_actions (seq) WHERE record_id IS NULL;
