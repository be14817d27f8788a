-- Per scope and UTC day, what the relay did, for `idemrelay report`. Records are purged after
-- their retention, so reconciliation over weeks needs counts that outlive them.
CREATE TABLE daily_counts (
    scope      TEXT    NOT NULL,
    day        TEXT    NOT NULL, -- YYYY-MM-DD, UTC
    accepted   INTEGER NOT NULL DEFAULT 0,
    replayed   INTEGER NOT NULL DEFAULT 0,
    delivered  INTEGER NOT NULL DEFAULT 0,
    failed     INTEGER NOT NULL DEFAULT 0,
    unresolved INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, day)
) STRICT;

-- Triggers, so that every path that writes a record (intake, settle, cancel, and whatever
-- comes later) is counted without each one having to remember to.
-- Accepted: a client's message that was queued; DSNs are the relay's own and not counted here.
CREATE TRIGGER daily_counts_accepted AFTER INSERT ON messages
WHEN NEW.state = 'queued' AND NEW.dsn_of IS NULL
BEGIN
    INSERT OR IGNORE INTO daily_counts (scope, day)
        VALUES (NEW.scope, date(NEW.accepted_at / 1000, 'unixepoch'));
    UPDATE daily_counts SET accepted = accepted + 1
        WHERE scope = NEW.scope AND day = date(NEW.accepted_at / 1000, 'unixepoch');
END;

-- Terminal outcomes, on the day they happened: what the upstream counts on its side (DSNs
-- included, since the upstream sends and counts them too).
CREATE TRIGGER daily_counts_finished AFTER UPDATE OF state ON messages
WHEN NEW.state IN ('delivered', 'failed', 'unresolved') AND OLD.state <> NEW.state
BEGIN
    INSERT OR IGNORE INTO daily_counts (scope, day)
        VALUES (NEW.scope, date(COALESCE(NEW.finished_at, NEW.accepted_at) / 1000, 'unixepoch'));
    UPDATE daily_counts SET
            delivered = delivered + (NEW.state = 'delivered'),
            failed = failed + (NEW.state = 'failed'),
            unresolved = unresolved + (NEW.state = 'unresolved')
        WHERE scope = NEW.scope
          AND day = date(COALESCE(NEW.finished_at, NEW.accepted_at) / 1000, 'unixepoch');
END;
