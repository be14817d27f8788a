-- The claim no longer waits for the scope's turn row. 0011 upserted it in every claim, and the
-- row stayed locked until the claim's commit (including its WAL flush), so every claim of a
-- scope queued behind the previous claimer's commit: with 32 workers on one scope, 66 % of the
-- backends' time was Lock:transactionid in this function and the claim rate was capped at
-- ~1 / (hold time): 188-256 claims/s in pgbench (issue 17 profile).
--
-- Now a claimer moves the turn only if it gets the row's lock at once (SKIP LOCKED). If the
-- lock is taken, the holder is a claim of the same scope (claims are the only statements that
-- lock these rows) and it is moving the scope to the back already, so the scope still goes to
-- the back; the second claim does not push it further. That is no loss of order: the head
-- reads the turns as last committed, so claims that overlap in time were never ordered among
-- themselves by the turn (they all saw the same front scope); they now move it once per
-- overlapping group instead of once each, one after the other's commit. A lone claimer (one
-- worker, or claims that do not overlap) always gets the lock: same order as before.
--
-- No insert for a missing row: the head returns only a scope it read from scope_turns, and no
-- statement deletes a turn row (intake and requeue insert it with the job), so the row is
-- there. Were it ever missing, the job is still claimed and only the turn stays; an upsert
-- here would again wait on a row another claimer holds.
CREATE OR REPLACE FUNCTION idemrelay_claim(p_owner TEXT, p_lease_ms BIGINT)
RETURNS TABLE (
    job_id TEXT, job_scope TEXT, now_ms BIGINT, recovered BOOLEAN,
    idem_key TEXT, mail_from TEXT, rcpt_to TEXT, body_type TEXT, smtputf8 BOOLEAN,
    content BYTEA, content_hash BYTEA, accepted_at BIGINT, first_attempt_at BIGINT,
    lease_token BIGINT, attempts BIGINT, any_unknown BOOLEAN
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    closed BIGINT;
BEGIN
    now_ms := idemrelay_now_ms();
    SELECT h.job_id, h.job_scope INTO job_id, job_scope FROM idemrelay_claim_head(now_ms) h;
    IF job_id IS NULL THEN
        RETURN;
    END IF;
    -- The scope goes to the back of the turns, unless a concurrent claim of it does so.
    PERFORM 1 FROM scope_turns t WHERE t.scope = job_scope FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        UPDATE scope_turns t SET turn = nextval('scope_turn_seq') WHERE t.scope = job_scope;
    END IF;
    UPDATE delivery_jobs j
        SET lease_owner = p_owner,
            lease_until = LEAST(now_ms::NUMERIC + p_lease_ms, 9223372036854775807)::BIGINT,
            lease_token = j.lease_token + 1
        WHERE j.message_id = job_id;
    -- An intent left open by a worker that lost its lease: whether the upstream got the
    -- message cannot be known, so it is recorded as UNKNOWN (DESIGN §2), never as not sent.
    UPDATE attempts a
        SET outcome = 'unknown', finished_at = now_ms,
            reply = 'worker stopped with this attempt open; outcome unknown'
        WHERE a.message_id = job_id AND a.outcome IS NULL;
    GET DIAGNOSTICS closed = ROW_COUNT;
    recovered := closed > 0;
    RETURN QUERY
        SELECT job_id, job_scope, now_ms, recovered,
               m.idem_key, m.mail_from, m.rcpt_to, m.body_type, m.smtputf8, m.content,
               m.content_hash, m.accepted_at, j.first_attempt_at, j.lease_token,
               (SELECT COUNT(*) FROM attempts a WHERE a.message_id = m.id),
               EXISTS (SELECT 1 FROM attempts a
                       WHERE a.message_id = m.id AND a.outcome = 'unknown')
        FROM messages m JOIN delivery_jobs j ON j.message_id = m.id
        WHERE m.id = job_id;
END $$;
