-- A claim in one call instead of eight round trips (BEGIN, clock, head, turn, lease, open
-- intents, details, COMMIT). The steps, their order and their locks are those the relay took
-- one statement at a time before: each statement of a plpgsql function takes a fresh snapshot
-- (READ COMMITTED), as each statement of the transaction did. The shorter transaction matters
-- beyond the round trips: every claim of a scope updates that scope's turn row, so claims of
-- one scope queue behind one another's commit.
CREATE FUNCTION idemrelay_claim(p_owner TEXT, p_lease_ms BIGINT)
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
    -- The scope goes to the back of the turns.
    INSERT INTO scope_turns (scope, turn) VALUES (job_scope, nextval('scope_turn_seq'))
        ON CONFLICT (scope) DO UPDATE SET turn = excluded.turn;
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
