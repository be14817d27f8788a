-- Intake writes what durability and the duplicate check need, and little else: every index
-- on `messages` is a page written (and fsynced) per commit, and at one message per commit
-- the indexes below were most of the 16 pages a 1 KB message cost. Each lookup they served
-- is answered another way (docs/contributing/performance.md, "The store's hot path"):
--
-- a key without its scope: the unique (scope, idem_key, part) index, once per scope, the
-- scopes found by a walk of that index's first column;
DROP INDEX messages_key;
-- records of one scope, newest first: the id (primary key) order, filtered by scope;
DROP INDEX messages_scope_id;
-- the queue filters and the retention purge look at finished records by state: those
-- entries are written when a record leaves `queued` (by the delivery side), not at intake;
-- queued records are listed in id order;
DROP INDEX messages_state_id;
CREATE INDEX messages_state_id ON messages (state, id) WHERE state <> 'queued';
DROP INDEX messages_state_accepted;
CREATE INDEX messages_state_accepted ON messages (state, accepted_at) WHERE state <> 'queued';
-- a Message-ID (a console search; upstream events find their record by the identifiers of
-- the events table): the finished records' through this index, written when a record
-- leaves `queued`; the queued records' by reading the queue;
DROP INDEX messages_header_message_id;
CREATE INDEX messages_header_message_id ON messages (header_message_id)
    WHERE header_message_id IS NOT NULL AND state <> 'queued';
-- an upstream key equal to the client's key (the common case: the scope that owns the
-- upstream's key space) is found through the key; only the others need an index;
DROP INDEX messages_upstream_key;
CREATE INDEX messages_upstream_key ON messages (upstream_key)
    WHERE upstream_key IS DISTINCT FROM idem_key;
-- jobs due later than now (`queue flush` of everything) are few enough to scan.
DROP INDEX delivery_jobs_due;
