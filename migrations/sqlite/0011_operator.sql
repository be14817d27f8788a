-- Operator tools (issue 15): a `cancelled` state of its own, the operator actions table, and
-- indexes for the queue filters.
--
-- SQLite cannot change a CHECK constraint with ALTER TABLE, and the documented rebuild (new
-- table, copy, drop, rename) needs foreign keys off, which cannot be switched inside the
-- migration's transaction: dropping `messages` with them on would cascade into attempts, jobs
-- and events. Widening a CHECK changes nothing stored, so the table's definition is edited in
-- place instead, as the SQLite manual describes for such changes ("Making Other Kinds Of Table
-- Schema Changes"). The DDL below bumps the schema version, so every connection that opens or
-- next reads the schema sees the new definition.
PRAGMA writable_schema = ON;
UPDATE sqlite_master
    SET sql = replace(sql, '''unresolved'', ''rejected'')',
                      '''unresolved'', ''rejected'', ''cancelled'')')
    WHERE type = 'table' AND name = 'messages';
PRAGMA writable_schema = OFF;

-- Cancelled records are counted on their own (they were `failed` before this migration).
ALTER TABLE daily_counts ADD COLUMN cancelled INTEGER NOT NULL DEFAULT 0;
DROP TRIGGER daily_counts_finished;
CREATE TRIGGER daily_counts_finished AFTER UPDATE OF state ON messages
WHEN NEW.state IN ('delivered', 'failed', 'unresolved', 'cancelled') AND OLD.state <> NEW.state
BEGIN
    INSERT OR IGNORE INTO daily_counts (scope, day)
        VALUES (NEW.scope, date(COALESCE(NEW.finished_at, NEW.accepted_at) / 1000, 'unixepoch'));
    UPDATE daily_counts SET
            delivered = delivered + (NEW.state = 'delivered'),
            failed = failed + (NEW.state = 'failed'),
            unresolved = unresolved + (NEW.state = 'unresolved'),
            cancelled = cancelled + (NEW.state = 'cancelled')
        WHERE scope = NEW.scope
          AND day = date(COALESCE(NEW.finished_at, NEW.accepted_at) / 1000, 'unixepoch');
END;

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
    seq       INTEGER PRIMARY KEY,
    at        INTEGER NOT NULL,
    record_id TEXT    REFERENCES messages (id) ON DELETE CASCADE,
    action    TEXT    NOT NULL,
    actor     TEXT    NOT NULL,
    reason    TEXT    NOT NULL,
    detail    TEXT
) STRICT;
CREATE INDEX operator_actions_record ON operator_actions (record_id, seq)
    WHERE record_id IS NOT NULL;
CREATE INDEX operator_actions_relay ON operator_actions (seq) WHERE record_id IS NULL;
