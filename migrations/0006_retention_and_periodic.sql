-- 0006_retention_and_periodic: why: finished jobs are pruned by age in small batches, so
-- the age of finished jobs needs an index; stats and `jobs retry --failed` count and find
-- failed and cancelled jobs without reading the whole table; and each periodic schedule
-- keeps the last tick it enqueued, so every tick is enqueued once across workers and
-- restarts. The indexes are partial: a job only enters the ones its status matches.
CREATE INDEX jobs_finished_idx ON shardworker.jobs (finished_at)
    WHERE status IN ('done', 'failed', 'cancelled');
CREATE INDEX jobs_failed_idx ON shardworker.jobs (queue, kind) WHERE status = 'failed';
CREATE INDEX jobs_cancelled_idx ON shardworker.jobs (queue, kind) WHERE status = 'cancelled';

-- One row per schedule name; the row's lock serializes the workers enqueueing a tick.
CREATE TABLE shardworker.periodic (
    name        text        PRIMARY KEY,
    schedule    text        NOT NULL,
    last_tick   timestamptz,            -- NULL until the first check: ticks start after it
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- What `shardworker workers` shows: each worker's load as of its last heartbeat.
ALTER TABLE shardworker.workers
    ADD COLUMN jobs_running   int,
    ADD COLUMN outbox_pending bigint;
