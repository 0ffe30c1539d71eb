-- 0025_durable_waits: why: a long job (an hour's pause, a human's approval, a webhook) had to
-- hold a worker while it waited, or be split by hand into jobs that enqueue each other. Now a
-- handler may sleep (job.sleep) or wait for an event (job.wait_event): its attempt ends, like
-- a snooze, and the job waits in its row, holding no child, thread or connection, until its
-- time comes or the event is sent; the next run replays its steps and goes on from the wait.
-- It may also report how far it got (job.progress).
--
-- A waiting job says what it waits on: wait_kind 'sleep' (until wait_until) or 'event' (for
-- an event sent to wait_key, at most until wait_until when the wait has a timeout), since
-- wait_since; a job waiting on the jobs it was enqueued after= has none (as before). wait_name
-- is the name of the handler's wait: the step under which its end (the sleep, the event, the
-- timeout) is recorded for the next run.
ALTER TABLE shardworker.jobs ADD COLUMN wait_kind text CHECK (wait_kind IN ('sleep', 'event'));
ALTER TABLE shardworker.jobs ADD COLUMN wait_name text;
ALTER TABLE shardworker.jobs ADD COLUMN wait_key text;
ALTER TABLE shardworker.jobs ADD COLUMN wait_until timestamptz;
ALTER TABLE shardworker.jobs ADD COLUMN wait_since timestamptz;
-- The last progress the handler reported (any small JSON), when (the child's clock) and in
-- which attempt; kept once the job ends.
ALTER TABLE shardworker.jobs ADD COLUMN progress jsonb;
ALTER TABLE shardworker.jobs ADD COLUMN progress_at timestamptz;
ALTER TABLE shardworker.jobs ADD COLUMN progress_attempt int;

-- The waiter's pass (wake_due): waits whose time has come.
CREATE INDEX jobs_wait_until_idx ON shardworker.jobs (wait_until)
    WHERE status = 'waiting' AND wait_until IS NOT NULL;
-- send_event: the jobs waiting on a key.
CREATE INDEX jobs_wait_key_idx ON shardworker.jobs (wait_key)
    WHERE status = 'waiting' AND wait_key IS NOT NULL;
-- wake_sent: the waits for an event begun lately.
CREATE INDEX jobs_wait_since_idx ON shardworker.jobs (wait_since)
    WHERE status = 'waiting' AND wait_kind = 'event';

-- Events sent (shardworker.send_event, job.send_event, `events send`), kept for a retention
-- period (`run --event-retention`) whether or not a job waited on them: a wait that starts
-- after its event was sent takes it. sent_at is when the send ran (clock_timestamp(), not the
-- start of the sender's transaction, which may have begun before the waiting job existed).
CREATE TABLE shardworker.events (
    id       bigserial   PRIMARY KEY,
    key      text        NOT NULL,
    payload  jsonb       NOT NULL,
    sent_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX events_key_idx ON shardworker.events (key, sent_at);
CREATE INDEX events_sent_at_idx ON shardworker.events (sent_at);

-- The events each job's handler sent (job.send_event), by their place among its sends: a run
-- replayed after a wait that sends them again sends each once. Kept as long as the job.
CREATE TABLE shardworker.job_sends (
    job_id  bigint NOT NULL REFERENCES shardworker.jobs (id) ON DELETE CASCADE,
    idx     int    NOT NULL,
    PRIMARY KEY (job_id, idx)
);

-- Record a wait's end as the step `name` of job `job_id` at `attempt` (the next run replays
-- it); the first recorded wins, as for every step.
CREATE FUNCTION shardworker.record_wait_end(job_id bigint, name text, attempt int, result jsonb) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO shardworker.job_steps (job_id, name, attempt, result, recorded_at, result_bytes)
    VALUES (job_id, name, attempt, result, now(), octet_length(result::text))
    ON CONFLICT DO NOTHING
$$;

-- The event a wait of job `job` on `event_key` takes: the first sent since `since` (the job's
-- enqueue) that the job has not taken yet (an earlier wait of its own on the same key took
-- those up to the last event_id its steps recorded). As a step's result: {"event": payload,
-- "event_id": id, "key": key}; NULL when there is none.
CREATE FUNCTION shardworker.next_event(job bigint, event_key text, since timestamptz) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('event', e.payload, 'event_id', e.id, 'key', e.key)
    FROM shardworker.events e
    WHERE e.key = event_key AND e.sent_at >= since
      AND e.id > coalesce((SELECT max((s.result ->> 'event_id')::bigint) FROM shardworker.job_steps s
                           WHERE s.job_id = job AND s.result ->> 'key' = event_key), 0)
    ORDER BY e.sent_at, e.id LIMIT 1
$$;

-- Send an event: keep it, and wake every job waiting on its key (the event recorded as the
-- step of each one's wait: a retry gets the same payload). How many jobs it woke. A wait that
-- begins while the event is being sent, neither seeing the other, is woken by wake_sent.
CREATE FUNCTION shardworker.send_event(event_key text, event_payload jsonb) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    woken int := 0;
    sent bigint;
BEGIN
    INSERT INTO shardworker.events (key, payload) VALUES (event_key, event_payload) RETURNING id INTO sent;
    WITH w AS (
        UPDATE shardworker.jobs j
        SET status = 'queued', run_at = now(), wait_kind = NULL, wait_key = NULL, wait_until = NULL,
            wait_since = NULL, updated_at = now()
        WHERE j.status = 'waiting' AND j.wait_kind = 'event' AND j.wait_key = event_key
        RETURNING j.id, j.wait_name, j.attempt
    ), recorded AS (
        SELECT shardworker.record_wait_end(w.id, w.wait_name, w.attempt,
                                           jsonb_build_object('event', event_payload, 'event_id', sent,
                                                              'key', event_key))
        FROM w
    )
    SELECT count(*) INTO woken FROM recorded;
    IF woken > 0 THEN
        PERFORM pg_notify('shardworker_jobs', '');
    END IF;
    RETURN woken;
END $$;

-- An event a handler sent (job.send_event), applied with its run's outcome: sent unless the
-- job already sent the event of that place (idx) among its sends.
CREATE FUNCTION shardworker.send_job_event(job bigint, idx int, event_key text, event_payload jsonb) RETURNS int
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO shardworker.job_sends (job_id, idx) VALUES (job, idx) ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    RETURN shardworker.send_event(event_key, event_payload);
END $$;

-- After an outcome 'suspended' set a job waiting: what it waits on (`wait`, from the handler:
-- {"kind": "sleep", "name", "until"} or {"kind": "event", "name", "key", "until" or null}).
-- A sleep is recorded at once as the step of its name (the next run, whenever it comes, passes
-- it); an event sent to the key since the job was enqueued, and not taken by it yet, ends the
-- wait at once.
CREATE FUNCTION shardworker.begin_wait(job_id bigint, job_attempt int, wait jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    taken jsonb;
    until timestamptz := CASE WHEN wait ->> 'until' IS NULL THEN NULL
                              ELSE to_timestamp((wait ->> 'until')::float8) END;
BEGIN
    IF wait ->> 'kind' = 'sleep' THEN
        UPDATE shardworker.jobs SET wait_kind = 'sleep', wait_name = wait ->> 'name', wait_until = until,
                                    wait_since = now()
        WHERE id = job_id AND status = 'waiting' AND attempt = job_attempt;
        IF FOUND THEN
            PERFORM shardworker.record_wait_end(job_id, wait ->> 'name', job_attempt,
                                                jsonb_build_object('slept_until', wait -> 'until'));
        END IF;
        RETURN;
    END IF;
    SELECT shardworker.next_event(j.id, wait ->> 'key', j.created_at) INTO taken
    FROM shardworker.jobs j WHERE j.id = job_id;
    IF taken IS NOT NULL THEN
        UPDATE shardworker.jobs SET status = 'queued', run_at = now()
        WHERE id = job_id AND status = 'waiting' AND attempt = job_attempt;
        IF FOUND THEN
            PERFORM shardworker.record_wait_end(job_id, wait ->> 'name', job_attempt, taken);
            PERFORM pg_notify('shardworker_jobs', '');
        END IF;
        RETURN;
    END IF;
    UPDATE shardworker.jobs SET wait_kind = 'event', wait_name = wait ->> 'name', wait_key = wait ->> 'key',
                                wait_until = until, wait_since = now()
    WHERE id = job_id AND status = 'waiting' AND attempt = job_attempt;
END $$;

-- The waiter's pass, run by every worker's housekeeping: sleeps that are over and event waits
-- past their timeout (that timeout recorded as the wait's step) go back to the queue. At most
-- `batch` jobs a call; rows another transaction holds (an event being sent) are left to it.
-- How many it woke.
CREATE FUNCTION shardworker.wake_due(batch int DEFAULT 1000) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    woken int;
BEGIN
    WITH due AS (
        SELECT id, wait_kind, wait_name FROM shardworker.jobs
        WHERE status = 'waiting' AND wait_until IS NOT NULL AND wait_until <= now()
        ORDER BY wait_until LIMIT batch FOR UPDATE SKIP LOCKED
    ), w AS (
        UPDATE shardworker.jobs j
        SET status = 'queued', run_at = now(), wait_kind = NULL, wait_key = NULL, wait_until = NULL,
            wait_since = NULL, updated_at = now()
        FROM due WHERE j.id = due.id
        RETURNING j.id, j.attempt, due.wait_kind, due.wait_name
    ), recorded AS (
        SELECT shardworker.record_wait_end(w.id, w.wait_name, w.attempt, '{"timeout": true}'::jsonb)
        FROM w WHERE w.wait_kind = 'event'
    )
    SELECT count(*) INTO woken FROM w WHERE (SELECT count(*) FROM recorded) >= 0;
    IF woken > 0 THEN
        PERFORM pg_notify('shardworker_jobs', '');
    END IF;
    RETURN woken;
END $$;

-- The net under send_event and begin_wait, which take no lock (a lock on the key would let an
-- application's open transaction stall a worker's batch, or two deadlock): a wait that began as
-- its event was sent, neither seeing the other, or an event sent by a transaction whose snapshot
-- predates the wait (REPEATABLE READ, SERIALIZABLE). Every worker's housekeeping looks, every few
-- seconds, at the waits for an event begun within `within_s`, and ends those whose event is
-- there. Rows another transaction holds are left to it. How many it woke.
CREATE FUNCTION shardworker.wake_sent(within_s float8 DEFAULT 3600, batch int DEFAULT 1000) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    taken jsonb;
    step_name text;
    step_attempt int;
    woken int := 0;
BEGIN
    FOR r IN
        SELECT j.id, j.created_at, j.wait_key FROM shardworker.jobs j
        WHERE j.status = 'waiting' AND j.wait_kind = 'event' AND j.wait_since > now() - make_interval(secs => within_s)
          AND EXISTS (SELECT FROM shardworker.events e WHERE e.key = j.wait_key AND e.sent_at >= j.created_at)
        ORDER BY j.wait_since LIMIT batch
    LOOP
        PERFORM FROM shardworker.jobs
        WHERE id = r.id AND status = 'waiting' AND wait_kind = 'event' AND wait_key = r.wait_key
        FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        taken := shardworker.next_event(r.id, r.wait_key, r.created_at);
        CONTINUE WHEN taken IS NULL;
        UPDATE shardworker.jobs
        SET status = 'queued', run_at = now(), wait_kind = NULL, wait_key = NULL, wait_until = NULL,
            wait_since = NULL, updated_at = now()
        WHERE id = r.id
        RETURNING wait_name, attempt INTO step_name, step_attempt;
        PERFORM shardworker.record_wait_end(r.id, step_name, step_attempt, taken);
        woken := woken + 1;
    END LOOP;
    IF woken > 0 THEN
        PERFORM pg_notify('shardworker_jobs', '');
    END IF;
    RETURN woken;
END $$;

-- The jobs waiting on others (after=) are those that wait on no sleep or event: a job that
-- sleeps or waits for an event ran already, its dependencies done, and a dependency deleted
-- since (or any other) must not cancel it. As 0020's, with that condition.
CREATE OR REPLACE FUNCTION shardworker.cancel_dependents(causes bigint[], whys text[]) RETURNS SETOF bigint
LANGUAGE sql VOLATILE AS $$
    WITH RECURSIVE doomed AS (
        SELECT d.job_id AS id, d.depends_on AS cause, c.why
        FROM unnest(causes, whys) AS c(id, why)
        JOIN shardworker.job_dependencies d ON d.depends_on = c.id
        JOIN shardworker.jobs w ON w.id = d.job_id AND w.status = 'waiting' AND w.wait_kind IS NULL
        UNION
        SELECT d.job_id, d.depends_on, 'ended cancelled'
        FROM doomed x JOIN shardworker.job_dependencies d ON d.depends_on = x.id
        JOIN shardworker.jobs w ON w.id = d.job_id AND w.status = 'waiting' AND w.wait_kind IS NULL
    ), cancelled AS (
        UPDATE shardworker.jobs w
        SET status = 'cancelled', last_error = 'waited on job ' || c.cause || ', which ' || c.why,
            finished_at = now(), updated_at = now()
        FROM (SELECT DISTINCT ON (id) id, cause, why FROM doomed ORDER BY id, cause) c
        WHERE w.id = c.id AND w.status = 'waiting' AND w.wait_kind IS NULL
        RETURNING w.id
    ), announced AS (
        SELECT shardworker.notify_finished(array_agg(id)) AS sent FROM cancelled
    )
    SELECT id FROM cancelled WHERE (SELECT count(*) FROM announced) >= 0
$$;
