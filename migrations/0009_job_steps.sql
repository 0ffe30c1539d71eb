-- 0009_job_steps: why: a long job's steps (`job.step(name, fn)`) must not run again once
-- they returned, whichever attempt, host or restart comes next; their results are kept here,
-- one row per job and name, and read back when the job is claimed again.

-- A step's result, as the child recorded it (recorded_at is the child's clock when its record
-- was fsync'd to the outbox, which may be long before it landed here, after an outage).
-- The first record of a name wins: a step result is a fact, whichever attempt wrote it, even
-- one since rescued. Deleting a job deletes its steps.
CREATE TABLE shardworker.job_steps (
    job_id       bigint      NOT NULL REFERENCES shardworker.jobs (id) ON DELETE CASCADE,
    name         text        NOT NULL,
    attempt      int         NOT NULL,
    result       jsonb       NOT NULL,
    recorded_at  timestamptz NOT NULL,
    PRIMARY KEY (job_id, name)
);

-- `jobs retry --reset-steps` forgets a job's steps: the records of the attempts up to this one
-- that still wait in some host's outbox are ignored when they land, so none comes back.
ALTER TABLE shardworker.jobs ADD COLUMN steps_reset_attempt int NOT NULL DEFAULT 0;
