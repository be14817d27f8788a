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
