-- What a client asked of delivery beyond the envelope: the DSN parameters (RET, ENVID, and
-- NOTIFY/ORCPT per recipient) and REQUIRETLS, as JSON (`DeliveryRequests::to_stored`).
-- NULL for ordinary mail, so a message without them writes nothing more. Numbered 0015 in
-- both dialects: migrations are numbered alike from here on.
ALTER TABLE messages ADD COLUMN requests TEXT;

-- The claim returns the column too. Its result type changes, which CREATE OR REPLACE cannot
-- do: the function is dropped and made again, as migration 0013 left it but for `requests`.
DROP FUNCTION idemrelay_claim(TEXT, BIGINT);
CREATE FUNCTION idemrelay_claim(p_owner TEXT, p_lease_ms BIGINT)
RETURNS TABLE (
    job_id TEXT, job_scope TEXT, now_ms BIGINT, recovered BOOLEAN,
    idem_key TEXT, mail_from TEXT, rcpt_to TEXT, body_type TEXT, smtputf8 BOOLEAN,
    content BYTEA, content_hash BYTEA, accepted_at BIGINT, first_attempt_at BIGINT,
    lease_token BIGINT, attempts BIGINT, any_unknown BOOLEAN, requests TEXT
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
    -- message cannot be known, so it is recorded as UNKNOWN (docs/concepts/delivery.md), never as not sent.
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
                       WHERE a.message_id = m.id AND a.outcome = 'unknown'),
               m.requests
        FROM messages m JOIN delivery_jobs j ON j.message_id = m.id
        WHERE m.id = job_id;
END $$;
