-- Which scope's keys an upstream sees unchanged. One upstream account is one key space, so
-- at most one scope may send it its clients' keys as they are; every other scope's keys carry
-- the scope. The first scope to ask owns it for good: every instance sharing this store reads
-- the same answer, whatever its own config says, and a renamed scope does not take over the
-- keys its old name sent.
CREATE TABLE upstream_key_owners (
    key_space  TEXT    PRIMARY KEY,
    scope      TEXT    NOT NULL,
    claimed_at INTEGER NOT NULL
) STRICT;
