-- 0025_durable_waits: why: a long job (an hour's pause, a human's approval, a webhook) had to
-- hold a worker while it waited, or be split by hand into jobs that enqueue each other. Now a
-- handler may sleep (job.sleep) or wait for an event (job.wait_event): its attempt ends, like
-- a snooze, and the job waits in its row, holding no child, thread or connection, until its
-- time comes or the event is sent; the next run replays its steps and goes on from the wait.
-- It may also report how far it got (job.progress).
--
-- A waiting job says what it waits on: wait_kind 'sleep' (until wait_until) or 'event' (for
-- an event sent to wait_key, at most until wait_until when the wait has a timeout); a job
-- waiting on the jobs it was enqueued after= has none (as before). wait_name is the name of
-- the handler's wait: the step under which its end (the sleep, the event's payload, the
-- timeout) is recorded for the next run.
ALTER TABLE shardworker.jobs ADD COLUMN wait_kind text CHECK (wait_kind IN ('sleep', 'event'));
ALTER TABLE shardworker.jobs ADD COLUMN wait_name text;
ALTER TABLE shardworker.jobs ADD COLUMN wait_key text;
ALTER TABLE shardworker.jobs ADD COLUMN wait_until timestamptz;
-- The last progress the handler reported (any small JSON), and when; kept once the job ends.
ALTER TABLE shardworker.jobs ADD COLUMN progress jsonb;
ALTER TABLE shardworker.jobs ADD COLUMN progress_at timestamptz;

-- The waiter's pass (wake_due): waits whose time has come.
CREATE INDEX jobs_wait_until_idx ON shardworker.jobs (wait_until)
    WHERE status = 'waiting' AND wait_until IS NOT NULL;
-- send_event: the jobs waiting on a key.
CREATE INDEX jobs_wait_key_idx ON shardworker.jobs (wait_key)
    WHERE status = 'waiting' AND wait_key IS NOT NULL;

-- Events sent (shardworker.send_event, job.send_event, `events send`), kept for a retention
-- period (`run --event-retention`) whether or not a job waited on them: a wait that starts
-- after its event was sent takes it. origin names an event a handler sent (its job and its
-- place among the run's sends): a run replayed after a wait sends it again, and it lands once.
CREATE TABLE shardworker.events (
    id       bigserial   PRIMARY KEY,
    key      text        NOT NULL,
    payload  jsonb       NOT NULL,
    sent_at  timestamptz NOT NULL DEFAULT now(),
    origin   text        UNIQUE
);
CREATE INDEX events_key_idx ON shardworker.events (key, id);
CREATE INDEX events_sent_at_idx ON shardworker.events (sent_at);

-- Record a wait's end as the step `name` of job `job_id` at `attempt` (the next run replays
-- it); the first recorded wins, as for every step.
CREATE FUNCTION shardworker.record_wait_end(job_id bigint, name text, attempt int, result jsonb) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO shardworker.job_steps (job_id, name, attempt, result, recorded_at, result_bytes)
    VALUES (job_id, name, attempt, result, now(), octet_length(result::text))
    ON CONFLICT DO NOTHING
$$;

-- Send an event: keep it, and wake every job waiting on its key (the payload recorded as the
-- step of each one's wait: a retry gets the same payload). An event with an origin already
-- sent is not sent again (a handler's run replayed). Events of one key take turns with the
-- waits that start on it (an advisory lock on the key): a wait that starts as its event is
-- sent either sees the event or is woken by it. How many jobs it woke.
CREATE FUNCTION shardworker.send_event(event_key text, event_payload jsonb, event_origin text DEFAULT NULL)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    woken int := 0;
    sent bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('shardworker-event:' || event_key, 0));
    INSERT INTO shardworker.events (key, payload, origin) VALUES (event_key, event_payload, event_origin)
    ON CONFLICT (origin) DO NOTHING RETURNING id INTO sent;
    IF sent IS NULL THEN
        RETURN 0;
    END IF;
    WITH w AS (
        UPDATE shardworker.jobs j
        SET status = 'queued', run_at = now(), wait_kind = NULL, wait_key = NULL, wait_until = NULL,
            updated_at = now()
        WHERE j.status = 'waiting' AND j.wait_kind = 'event' AND j.wait_key = event_key
        RETURNING j.id, j.wait_name, j.attempt
    ), recorded AS (
        SELECT shardworker.record_wait_end(w.id, w.wait_name, w.attempt, jsonb_build_object('event', event_payload))
        FROM w
    )
    SELECT count(*) INTO woken FROM recorded;
    IF woken > 0 THEN
        PERFORM pg_notify('shardworker_jobs', '');
    END IF;
    RETURN woken;
END $$;

-- After an outcome 'suspended' set a job waiting: what it waits on (`wait`, from the handler:
-- {"kind": "sleep", "name", "until"} or {"kind": "event", "name", "key", "until" or null}).
-- A sleep is recorded at once as the step of its name (the next run, whenever it comes, passes
-- it); an event already sent to the key since the job was enqueued ends the wait at once.
CREATE FUNCTION shardworker.begin_wait(job_id bigint, job_attempt int, wait jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    sent_payload jsonb;
    until timestamptz := CASE WHEN wait ->> 'until' IS NULL THEN NULL
                              ELSE to_timestamp((wait ->> 'until')::float8) END;
BEGIN
    IF wait ->> 'kind' = 'sleep' THEN
        UPDATE shardworker.jobs SET wait_kind = 'sleep', wait_name = wait ->> 'name', wait_until = until
        WHERE id = job_id AND status = 'waiting' AND attempt = job_attempt;
        IF FOUND THEN
            PERFORM shardworker.record_wait_end(job_id, wait ->> 'name', job_attempt,
                                                jsonb_build_object('slept_until', wait -> 'until'));
        END IF;
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('shardworker-event:' || (wait ->> 'key'), 0));
    SELECT e.payload INTO sent_payload FROM shardworker.events e, shardworker.jobs j
    WHERE j.id = job_id AND e.key = wait ->> 'key' AND e.sent_at >= j.created_at
    ORDER BY e.id LIMIT 1;
    IF sent_payload IS NOT NULL THEN
        UPDATE shardworker.jobs SET status = 'queued', run_at = now()
        WHERE id = job_id AND status = 'waiting' AND attempt = job_attempt;
        IF FOUND THEN
            PERFORM shardworker.record_wait_end(job_id, wait ->> 'name', job_attempt,
                                                jsonb_build_object('event', sent_payload));
            PERFORM pg_notify('shardworker_jobs', '');
        END IF;
        RETURN;
    END IF;
    UPDATE shardworker.jobs SET wait_kind = 'event', wait_name = wait ->> 'name', wait_key = wait ->> 'key',
                                wait_until = until
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
            updated_at = now()
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
