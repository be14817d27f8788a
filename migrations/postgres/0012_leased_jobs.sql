-- The dead-lease check looks for leased jobs only; without an index it scanned every queued
-- job (see the SQLite migration 0012). Leased jobs are at most the delivery connections in
-- flight, so this index stays a few entries deep at any queue depth.
CREATE INDEX delivery_jobs_leased ON delivery_jobs (lease_until) WHERE lease_owner IS NOT NULL;
