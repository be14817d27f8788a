-- Liveness (DESIGN §2): every relay process keeps its row's heartbeat fresh while it runs. A
-- lease whose owner's heartbeat has gone stale is taken over before it expires; host names
-- and process ids are no evidence (containers share both). A lease owner is `<id>-<worker>`.
CREATE TABLE relay_processes (
    id           TEXT   PRIMARY KEY,
    started_at   BIGINT NOT NULL,
    heartbeat_at BIGINT NOT NULL
);
