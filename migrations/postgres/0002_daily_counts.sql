-- Per scope and UTC day counts for `idemrelay report`, kept by triggers so that every path
-- that writes a record counts it and the counts outlive the retention purge. Unlike SQLite,
-- the counters are spread over 8 shards per (scope, day): with one row, every intake of a
-- scope on every instance would queue on that row's lock until its commit.
CREATE TABLE daily_counts (
    scope      TEXT     NOT NULL,
    day        TEXT     NOT NULL, -- YYYY-MM-DD, UTC
    shard      SMALLINT NOT NULL,
    accepted   BIGINT   NOT NULL DEFAULT 0,
    replayed   BIGINT   NOT NULL DEFAULT 0,
    delivered  BIGINT   NOT NULL DEFAULT 0,
    failed     BIGINT   NOT NULL DEFAULT 0,
    unresolved BIGINT   NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, day, shard)
);

CREATE FUNCTION idemrelay_utc_day(ms BIGINT) RETURNS TEXT
    LANGUAGE sql STABLE
    AS $$ SELECT to_char(to_timestamp(ms / 1000.0) AT TIME ZONE 'UTC', 'YYYY-MM-DD') $$;

CREATE FUNCTION idemrelay_count_accepted() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO daily_counts (scope, day, shard, accepted)
    VALUES (NEW.scope, idemrelay_utc_day(NEW.accepted_at), hashtext(NEW.id) & 7, 1)
    ON CONFLICT (scope, day, shard) DO UPDATE SET accepted = daily_counts.accepted + 1;
    RETURN NULL;
END
$$;

CREATE TRIGGER daily_counts_accepted AFTER INSERT ON messages
    FOR EACH ROW WHEN (NEW.state = 'queued' AND NEW.dsn_of IS NULL)
    EXECUTE FUNCTION idemrelay_count_accepted();

CREATE FUNCTION idemrelay_count_finished() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO daily_counts (scope, day, shard, delivered, failed, unresolved)
    VALUES (NEW.scope, idemrelay_utc_day(COALESCE(NEW.finished_at, NEW.accepted_at)),
            hashtext(NEW.id) & 7, (NEW.state = 'delivered')::INT, (NEW.state = 'failed')::INT,
            (NEW.state = 'unresolved')::INT)
    ON CONFLICT (scope, day, shard) DO UPDATE SET
        delivered = daily_counts.delivered + excluded.delivered,
        failed = daily_counts.failed + excluded.failed,
        unresolved = daily_counts.unresolved + excluded.unresolved;
    RETURN NULL;
END
$$;

CREATE TRIGGER daily_counts_finished AFTER UPDATE OF state ON messages
    FOR EACH ROW WHEN (NEW.state IN ('delivered', 'failed', 'unresolved')
                       AND OLD.state <> NEW.state)
    EXECUTE FUNCTION idemrelay_count_finished();
