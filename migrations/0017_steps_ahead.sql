-- 0017_steps_ahead: why: after the database went back in time, a job's row can be
-- behind its own steps: the claim that recorded them was lost, the steps landed again from the
-- kept tail, and the next claim of the job is the same attempt number. A claim reads a job's
-- recorded steps only after its first attempt (a first attempt has none, and costs nothing
-- there); steps_ahead tells it to read them anyway. job_steps_ahead sets it when a step lands
-- for an attempt its row does not show yet. It stays: the job's later claims are retries,
-- which read the steps anyway.
ALTER TABLE shardworker.jobs ADD COLUMN steps_ahead boolean NOT NULL DEFAULT false;
