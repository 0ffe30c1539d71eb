-- 0015_database_regression: why: a database can come back older than what the workers saw
-- it commit (a failover to an asynchronous replica that lagged, a restore from a backup):
-- claims, outcomes, steps and follow-ups that were committed are gone, and so are the
-- heartbeat rows and rescues of that stretch. Workers keep what they applied for a window
-- (run --reapply-window) and apply it again; this gives them what they need for that.

-- A job's identity beside its id: an id the sequence handed out for an insert the database
-- lost is handed out again, to another job, so a kept outcome or step checks the uid it ran
-- under before it lands. Rows from before have none (NULL matches any uid). ADD COLUMN and
-- then SET DEFAULT: a volatile default given in ADD COLUMN would rewrite the table.
ALTER TABLE shardworker.jobs ADD COLUMN uid bigint;
ALTER TABLE shardworker.jobs ALTER COLUMN uid SET DEFAULT (random() * 9.2e18)::bigint;

-- How far the database holds what each outbox's flusher applied: the count of batches and,
-- per shard, the outbox position after the last record applied ({"3": [segment, offset,
-- sequence]}), written in the transaction that applies each batch. A flusher that knows it
-- committed more than the row says finds the database went back, and re-applies its kept
-- records from these positions.
CREATE TABLE shardworker.outbox_marks (
    outbox_id   text        PRIMARY KEY,
    worker_id   text        NOT NULL,
    batch       bigint      NOT NULL,
    positions   jsonb       NOT NULL DEFAULT '{}',
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- While a row here is live (until > now()), no worker claims: a worker re-applying what the
-- database lost holds one (a claim lost with the rest could otherwise be made again, and its
-- job run again, before the kept outcome lands), and so, for a few seconds, does a worker
-- that finds itself on a new server, so that every worker has looked at its own mark first.
CREATE TABLE shardworker.claim_holds (
    holder      text        PRIMARY KEY,
    reason      text        NOT NULL,
    until       timestamptz NOT NULL
);

-- A rescue leaves a tombstone of the rescued process (its row's started_at): a worker whose
-- heartbeat row is gone stops only if a rescue removed it. A row the database lost by going
-- back in time is written again, and the worker goes on.
CREATE TABLE shardworker.worker_rescues (
    worker_id   text        NOT NULL,
    started_at  timestamptz NOT NULL,
    rescued_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (worker_id, started_at)
);

-- Advance an outbox's mark (job_apply_outcomes and job_steps_insert call it in the
-- transaction of the batch they apply): the batch count, and the positions of the shards
-- the batch read (each shard's position replaced, the others kept).
CREATE FUNCTION shardworker.outbox_mark(outbox text, worker text, batch bigint, positions jsonb) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    INSERT INTO shardworker.outbox_marks AS m (outbox_id, worker_id, batch, positions)
    VALUES (outbox, worker, batch, positions)
    ON CONFLICT (outbox_id) DO UPDATE
    SET worker_id = excluded.worker_id, batch = excluded.batch, positions = m.positions || excluded.positions,
        updated_at = now()
    RETURNING batch
$$;
