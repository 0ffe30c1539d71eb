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

-- Check an outbox's mark, and advance it (job_apply_outcomes and job_steps_insert call it in
-- the transaction of the batch they apply). The database must hold at least `expect`, the
-- batch the flusher last saw committed: if it holds less, it went back in time, and the
-- call fails with SQLSTATE SWR01 (shardworker.errors.DatabaseWentBack), failing the
-- transaction, so that nothing is applied on top of a past the flusher has not re-applied.
-- With `write`, the mark becomes `batch` and the positions of the shards the batch read
-- (each shard's position replaced, the others kept).
CREATE FUNCTION shardworker.outbox_mark(outbox text, worker text, batch bigint, positions jsonb, expect bigint,
                                        write boolean) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    held bigint;
BEGIN
    SELECT m.batch INTO held FROM shardworker.outbox_marks m WHERE m.outbox_id = outbox FOR UPDATE;
    IF coalesce(held, 0) < expect THEN
        RAISE EXCEPTION 'the database holds batch % of outbox %, whose flusher saw batch % committed',
                        coalesce(held, 0), outbox, expect
            USING ERRCODE = 'SWR01', HINT = 'the database went back in time (a failover or a restore)';
    END IF;
    IF write THEN
        INSERT INTO shardworker.outbox_marks AS m (outbox_id, worker_id, batch, positions)
        VALUES (outbox, worker, outbox_mark.batch, outbox_mark.positions)
        ON CONFLICT (outbox_id) DO UPDATE
        SET worker_id = excluded.worker_id, batch = excluded.batch, positions = m.positions || excluded.positions,
            updated_at = now();
    END IF;
    RETURN coalesce(held, 0);
END
$$;
