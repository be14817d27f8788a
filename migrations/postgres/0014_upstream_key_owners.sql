-- Which scope's keys an upstream sees unchanged (see the SQLite migration 0013): the first
-- scope to ask owns the key space for good, the same answer for every instance.
CREATE TABLE upstream_key_owners (
    key_space  TEXT   PRIMARY KEY,
    scope      TEXT   NOT NULL,
    claimed_at BIGINT NOT NULL
);
