-- Fencing token: bumped at every claim and checked by every write of the lease holder, so a
-- worker whose lease expired and was claimed again cannot write over the newer attempt.
ALTER TABLE delivery_jobs ADD COLUMN lease_token INTEGER NOT NULL DEFAULT 0;
