-- 0010_job_dependencies: why: workflows. A job may wait on others (`after=`): it stays
-- `waiting` until the last of them is applied as done, in the transaction that applies it,
-- and is cancelled when one of them fails, is cancelled or is deleted. A handler's follow-up
-- jobs (`job.enqueue`) travel in its outcome record and are inserted by the flusher in the
-- transaction that applies the outcome.

-- A new status: waiting on dependencies (never claimed).
ALTER TABLE shardworker.jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE shardworker.jobs ADD CONSTRAINT jobs_status_check
    CHECK (status IN ('waiting', 'queued', 'running', 'done', 'failed', 'cancelled'));

-- A waiting job holds its dedupe key as a queued one does.
DROP INDEX shardworker.jobs_dedupe_idx;
CREATE UNIQUE INDEX jobs_dedupe_idx ON shardworker.jobs (dedupe_key)
    WHERE dedupe_key IS NOT NULL AND status IN ('waiting', 'queued', 'running');

-- One row per edge: job_id waits on depends_on. No foreign key on depends_on: a dependency
-- deleted cancels the jobs waiting on it (job_delete does), and its rows stay to say why.
CREATE TABLE shardworker.job_dependencies (
    job_id      bigint NOT NULL REFERENCES shardworker.jobs (id) ON DELETE CASCADE,
    depends_on  bigint NOT NULL,
    PRIMARY KEY (job_id, depends_on)
);
CREATE INDEX job_dependencies_depends_on_idx ON shardworker.job_dependencies (depends_on);

-- deps_total: how many jobs this one waits on (0 for nearly every job: the claim reads
-- job.dependencies only when it is not). deps_pending: how many of them are not done yet.
-- deps_bytes: the size of the done ones' results, which the claim's byte budget counts.
-- has_dependents: some job waits on this one (applying its outcome looks for them only then).
ALTER TABLE shardworker.jobs
    ADD COLUMN deps_total int NOT NULL DEFAULT 0,
    ADD COLUMN deps_pending int NOT NULL DEFAULT 0,
    ADD COLUMN deps_bytes bigint NOT NULL DEFAULT 0,
    ADD COLUMN has_dependents boolean NOT NULL DEFAULT false;

-- `jobs list --status waiting` and stats read waiting jobs without the finished ones.
CREATE INDEX jobs_waiting_idx ON shardworker.jobs (id) WHERE status = 'waiting';
