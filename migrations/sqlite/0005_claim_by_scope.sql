-- A claim looks at the head of each scope's queue (an index probe per scope) instead of
-- sorting every due job: with a backlog of thousands, that sort cost milliseconds per claim
-- inside the one writer transaction.
ALTER TABLE delivery_jobs ADD COLUMN scope TEXT NOT NULL DEFAULT '';
UPDATE delivery_jobs
    SET scope = (SELECT m.scope FROM messages m WHERE m.id = delivery_jobs.message_id);
-- Ties on due_at (several jobs in one millisecond) go in insertion order: the index ends in
-- the rowid, which grows with each insert.
CREATE INDEX delivery_jobs_scope_due ON delivery_jobs (scope, due_at);
-- Every scope with jobs has a turn row; a new scope starts at turn 0, ahead of the others.
INSERT OR IGNORE INTO scope_turns (scope, turn) SELECT DISTINCT scope, 0 FROM delivery_jobs;

-- Bookkeeping the writer would otherwise send as statements of their own. Every statement
-- costs a round trip to the connection's thread inside the one writer transaction, so these
-- follow from the rows they belong to:
-- a queued message gets its delivery job, due at once;
CREATE TRIGGER delivery_job_for_queued_message AFTER INSERT ON messages
WHEN NEW.state = 'queued'
BEGIN
    INSERT INTO delivery_jobs (message_id, scope, due_at)
        VALUES (NEW.id, NEW.scope, NEW.accepted_at);
END;
-- a job's scope gets a turn row (a new scope goes ahead of those already served);
CREATE TRIGGER scope_turn_for_new_job AFTER INSERT ON delivery_jobs
BEGIN
    INSERT OR IGNORE INTO scope_turns (scope, turn) VALUES (NEW.scope, 0);
END;
-- a claim (the only write that changes the lease token) sends its scope to the back;
CREATE TRIGGER scope_turn_on_claim AFTER UPDATE OF lease_token ON delivery_jobs
BEGIN
    UPDATE scope_turns SET turn = (SELECT MAX(turn) FROM scope_turns) + 1
        WHERE scope = NEW.scope;
END;
-- the first intent sets the time the upstream window counts from.
CREATE TRIGGER first_attempt_time AFTER INSERT ON attempts
BEGIN
    UPDATE delivery_jobs SET first_attempt_at = COALESCE(first_attempt_at, NEW.started_at)
        WHERE message_id = NEW.message_id;
END;
