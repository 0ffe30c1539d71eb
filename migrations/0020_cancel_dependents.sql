-- 0020_cancel_dependents: why: the walk that cancels the jobs waiting behind a job that
-- ended badly, transitively, each naming the job it waited on, was written three times (the
-- trigger of 0016, an operator's cancel or delete, and the apply's settle). Written once.

-- Cancel the jobs waiting on ``causes`` (``whys``, pairwise: how each cause ended, as
-- 'ended failed' or 'was deleted'), and those waiting on them, transitively ('ended
-- cancelled'). Each names the job it waited on, the lowest id when it waited on several.
-- Announced as jobs that ended; returns the ids cancelled.
CREATE FUNCTION shardworker.cancel_dependents(causes bigint[], whys text[]) RETURNS SETOF bigint
LANGUAGE sql VOLATILE AS $$
    WITH RECURSIVE doomed AS (
        SELECT d.job_id AS id, d.depends_on AS cause, c.why
        FROM unnest(causes, whys) AS c(id, why)
        JOIN shardworker.job_dependencies d ON d.depends_on = c.id
        JOIN shardworker.jobs w ON w.id = d.job_id AND w.status = 'waiting'
        UNION
        SELECT d.job_id, d.depends_on, 'ended cancelled'
        FROM doomed x JOIN shardworker.job_dependencies d ON d.depends_on = x.id
        JOIN shardworker.jobs w ON w.id = d.job_id AND w.status = 'waiting'
    ), cancelled AS (
        UPDATE shardworker.jobs w
        SET status = 'cancelled', last_error = 'waited on job ' || c.cause || ', which ' || c.why,
            finished_at = now(), updated_at = now()
        FROM (SELECT DISTINCT ON (id) id, cause, why FROM doomed ORDER BY id, cause) c
        WHERE w.id = c.id AND w.status = 'waiting'
        RETURNING w.id
    ), announced AS (
        SELECT shardworker.notify_finished(array_agg(id)) AS sent FROM cancelled
    )
    SELECT id FROM cancelled WHERE (SELECT count(*) FROM announced) >= 0
$$;

-- The trigger of 0016: a job with dependents that failed anywhere (a rescue, a requeue of
-- orphans, an operator's UPDATE) cancels them.
CREATE OR REPLACE FUNCTION shardworker.cancel_waiting_dependents() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM shardworker.cancel_dependents(ARRAY[NEW.id], ARRAY['ended ' || NEW.status]);
    RETURN NULL;
END
$$;
