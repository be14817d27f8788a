-- Jobs due in the same millisecond are claimed in insertion order (queue ids are ordered
-- only to the millisecond).
ALTER TABLE delivery_jobs ADD COLUMN seq BIGSERIAL;
