-- The intake writes several records in one transaction (group commit). Their accepted counts
-- go to one shard per transaction, picked by its transaction id, instead of one per record
-- id: a batch then locks one counter row per scope, and two batches lock theirs in scope
-- order (their members are written sorted), instead of up to 8 rows each in any order, which
-- deadlocked concurrent batches. Consecutive transactions still spread over the 8 shards.
CREATE OR REPLACE FUNCTION idemrelay_count_accepted() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO daily_counts (scope, day, shard, accepted)
    VALUES (NEW.scope, idemrelay_utc_day(NEW.accepted_at), (txid_current() & 7)::SMALLINT, 1)
    ON CONFLICT (scope, day, shard) DO UPDATE SET accepted = daily_counts.accepted + 1;
    RETURN NULL;
END
$$;
