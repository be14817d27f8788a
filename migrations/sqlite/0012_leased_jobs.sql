-- The dead-lease check (every 2 s, in the one writer) looks for leased jobs only, but without
-- an index it scanned every queued job: 83 ms warm and 238 ms cold on a 500,000-job queue,
-- during which intake and claims wait. Leased jobs are at most the delivery connections in
-- flight, so this index stays a few entries deep at any queue depth.
CREATE INDEX delivery_jobs_leased ON delivery_jobs (lease_until) WHERE lease_owner IS NOT NULL;
