-- 0016_settle_wherever_a_job_ends: why: a job that ended failed outside the flusher (a peer's
-- rescue at its last attempt, a restart's requeue of its orphans, a lost outcome's requeue, an
-- operator's own UPDATE) left the jobs waiting on it waiting for ever: only the apply settled
-- them. A trigger now cancels them, transitively, wherever a job with dependents fails, each
-- naming the job it waited on, and announces them as job_dependents_cancel does (when the
-- apply's job_dependents_settle runs too, it finds nothing left waiting). A job that ends done
-- is only ever ended by the apply, and one cancelled by `jobs cancel` or a cancelled outcome,
-- which both cancel its dependents themselves.
CREATE FUNCTION shardworker.cancel_waiting_dependents() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
BEGIN
    WITH RECURSIVE doomed AS (
        SELECT d.job_id AS id, d.depends_on AS cause, NEW.status AS cause_status
        FROM shardworker.job_dependencies d
        JOIN shardworker.jobs w ON w.id = d.job_id AND w.status = 'waiting'
        WHERE d.depends_on = NEW.id
        UNION
        SELECT d.job_id, d.depends_on, 'cancelled'
        FROM doomed x JOIN shardworker.job_dependencies d ON d.depends_on = x.id
        JOIN shardworker.jobs w ON w.id = d.job_id AND w.status = 'waiting'
    ), cancelled AS (
        UPDATE shardworker.jobs w
        SET status = 'cancelled', last_error = 'waited on job ' || c.cause || ', which ended ' || c.cause_status,
            finished_at = now(), updated_at = now()
        FROM (SELECT DISTINCT ON (id) id, cause, cause_status FROM doomed ORDER BY id, cause) c
        WHERE w.id = c.id AND w.status = 'waiting'
        RETURNING w.id
    )
    SELECT array_agg(id) INTO ids FROM cancelled;
    IF ids IS NOT NULL THEN  -- wait_for callers hear of them, 300 ids a notification
        PERFORM pg_notify('shardworker_finished', string_agg(i::text, ','))
        FROM (SELECT i, (row_number() OVER ()) / 300 AS chunk FROM unnest(ids) AS i) x
        GROUP BY chunk;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_end_cancels_waiting_dependents
AFTER UPDATE OF status ON shardworker.jobs
FOR EACH ROW
WHEN (NEW.has_dependents AND NEW.status = 'failed' AND OLD.status IS DISTINCT FROM NEW.status)
EXECUTE FUNCTION shardworker.cancel_waiting_dependents();
