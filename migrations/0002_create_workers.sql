-- 0002_create_workers: why: workers heartbeat here so a rescuer can tell a worker that
-- went silent while others kept beating from a database outage that silenced everyone.
CREATE TABLE shardworker.workers (
    worker_id     text        PRIMARY KEY,
    hostname      text        NOT NULL,
    pid           int         NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now()
);
