-- 0022_job_keys: why: one tenant's 50,000 jobs made another's 10 wait behind them, and no
-- limit could say "at most N at once for one customer". A job now may carry a key (a
-- tenant, an account: enqueue(..., key=)); claims take the keys of a queue in turn, and a
-- kind or a queue may cap how many jobs of one key run at once across workers
-- (key_concurrency). Jobs without a key cost nothing more: every index below is partial on
-- key IS NOT NULL.
ALTER TABLE shardworker.jobs ADD COLUMN key text;

-- The turns: a claim walks the queues' keys that have queued jobs, one index probe a key,
-- and takes each key's best due jobs from here (the name bounded as in 0007).
CREATE INDEX jobs_queued_keys_idx ON shardworker.jobs (left(queue, 255), key, priority, run_at, id)
    WHERE status = 'queued' AND key IS NOT NULL;

-- The running jobs of a key, which key_concurrency counts.
CREATE INDEX jobs_running_keys_idx ON shardworker.jobs (key, kind, queue)
    WHERE status = 'running' AND key IS NOT NULL;

-- `jobs list --key`: a key's jobs, newest first.
CREATE INDEX jobs_key_idx ON shardworker.jobs (key, id) WHERE key IS NOT NULL;

ALTER TABLE shardworker.kinds ADD COLUMN key_concurrency int CHECK (key_concurrency >= 1);
ALTER TABLE shardworker.queues ADD COLUMN key_concurrency int CHECK (key_concurrency >= 1);

-- Where each worker's claims are in the turn of keys: the (queue, key) its last claim walked
-- to; the next walks on from there (and from the first when it reached the last).
CREATE TABLE shardworker.key_turns (
    worker_id  text PRIMARY KEY,
    queue      text NOT NULL,
    key        text NOT NULL
);
