-- 0017_steps_ahead_and_new_servers: why: after the database went back in time, a job's row can be
-- behind its own steps: the claim that recorded them was lost, the steps landed again from the
-- kept tail, and the next claim of the job is the same attempt number. A claim reads a job's
-- recorded steps only after its first attempt (a first attempt has none, and costs nothing
-- there); steps_ahead tells it to read them anyway. job_steps_ahead sets it when a step lands
-- for an attempt its row does not show yet. It stays: the job's later claims are retries,
-- which read the steps anyway.
ALTER TABLE shardworker.jobs ADD COLUMN steps_ahead boolean NOT NULL DEFAULT false;

-- Which server a session reached (its start time and the database's oid): another value than
-- before means a failover, a restore or a restart, after any of which the database may be
-- older than it was. A claim made for another server than the one the worker looked at is
-- refused (job_claim), and each heartbeat notes the server it reached (workers.server).
CREATE FUNCTION shardworker.server_identity() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT pg_postmaster_start_time()::text || ' ' || (SELECT oid FROM pg_database WHERE datname = current_database())::text
$$;

-- After a new server: each worker says it has checked that the database holds what it applied
-- (checked_server), and a hold on claims taken for a new server (claim_holds.server) lasts until
-- every worker it waits for (waits_for: those that were beating around the database's latest
-- state) has said so, or its time is up.
ALTER TABLE shardworker.workers ADD COLUMN server text, ADD COLUMN checked_server text;
ALTER TABLE shardworker.claim_holds ADD COLUMN server text, ADD COLUMN waits_for text[];

-- A follow-up inserted again after the database went back in time (its parent's outcome applied
-- again from a kept tail) is marked: an outcome of it kept elsewhere names it by its old id,
-- which the insert may not have got back (another job took it meanwhile), and finds it by its
-- uid instead (which its parent's run gives it). Only such rows are indexed.
ALTER TABLE shardworker.jobs ADD COLUMN reinserted boolean NOT NULL DEFAULT false;
CREATE INDEX jobs_reinserted_uid_idx ON shardworker.jobs (uid) WHERE reinserted;
