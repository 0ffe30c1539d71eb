-- 0013_worker_kinds: why: a kind nobody handles is seen. Each worker's heartbeat row says
-- what it serves: the kinds it has handlers for, the queues it claims from (NULL: every
-- queue) and its rescue window. A worker counts as serving them while its heartbeat is
-- within that window (until a peer would rescue its jobs), so `doctor`, the dashboard, the
-- worker's own log and `enqueue --strict` can name queued kinds that no live worker serves.
-- A row without kinds (an `outbox drain` beating for a worker, a worker of an older
-- version) serves nothing.
ALTER TABLE shardworker.workers
    ADD COLUMN kinds          text[],
    ADD COLUMN queues         text[],
    ADD COLUMN rescue_after_s float8;

-- The one reading of "live" for what workers serve: a row with kinds whose heartbeat is
-- within its rescue window, by the database's clock.
CREATE VIEW shardworker.serving_workers AS
SELECT worker_id, kinds, queues FROM shardworker.workers
WHERE kinds IS NOT NULL AND heartbeat_at >= now() - make_interval(secs => coalesce(rescue_after_s, 0));
