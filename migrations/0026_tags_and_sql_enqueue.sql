-- 0026_tags_and_sql_enqueue: why: operators could find and act on jobs only by id, kind or
-- status ("retry the failed imports of customer 42" meant SQL by hand); and only Python could
-- enqueue with shardworker's checks and wake-up (a Node or Go service, a trigger, a psql script
-- had to copy the INSERT and the NOTIFY, and got the checks wrong).
--
-- Tags: a job may carry a few labels (enqueue(..., tags=["import", "customer:42"])), which
-- `jobs list --tag` and the bulk `jobs retry|cancel|delete --tag` select by. NULL: none (most
-- jobs): the index is partial, so untagged jobs cost nothing more.
ALTER TABLE shardworker.jobs ADD COLUMN tags text[];
CREATE INDEX jobs_tags_idx ON shardworker.jobs USING gin (tags) WHERE tags IS NOT NULL;

-- Enqueue from SQL: any client calls one function in its own transaction (the job exists only
-- if it commits; the workers are woken at the commit):
--
--     SELECT shardworker.enqueue('email', '{"to": "ana@example.com"}', queue => 'mail');
--
-- It checks what the Python client checks (names, keys and tags within the limits of
-- shardworker.core.limits, a queue name `run --queues` can give, attempts, the delay, the
-- payload's size), raising invalid_parameter_value (22023) with one line that says why, and
-- returns the job's id, or NULL when a live job (waiting, queued or running) holds its
-- dedupe_key. Dependencies (after=) and dedupe windows stay with the Python client.
CREATE FUNCTION shardworker.enqueue(kind text, payload jsonb DEFAULT 'null', queue text DEFAULT 'default',
                                    priority int DEFAULT 0, run_at timestamptz DEFAULT NULL,
                                    dedupe_key text DEFAULT NULL, max_attempts int DEFAULT 25,
                                    key text DEFAULT NULL, delay_s float8 DEFAULT 0, tags text[] DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    new_id bigint;
    payload_text text := coalesce(enqueue.payload, 'null'::jsonb)::text;
BEGIN
    IF enqueue.kind IS NULL OR enqueue.kind = '' THEN
        RAISE EXCEPTION 'shardworker.enqueue: kind must be a non-empty string' USING ERRCODE = '22023';
    END IF;
    IF octet_length(enqueue.kind) > 255 THEN
        RAISE EXCEPTION 'shardworker.enqueue: kind is % bytes of UTF-8, the limit is 255',
            octet_length(enqueue.kind) USING ERRCODE = '22023';
    END IF;
    IF enqueue.queue IS NULL OR enqueue.queue = '' THEN
        RAISE EXCEPTION 'shardworker.enqueue: queue must be a non-empty string' USING ERRCODE = '22023';
    END IF;
    IF octet_length(enqueue.queue) > 255 THEN
        RAISE EXCEPTION 'shardworker.enqueue: queue is % bytes of UTF-8, the limit is 255',
            octet_length(enqueue.queue) USING ERRCODE = '22023';
    END IF;
    IF strpos(enqueue.queue, ',') > 0 OR enqueue.queue ~ '[[:cntrl:]]' OR enqueue.queue <> btrim(enqueue.queue) THEN
        RAISE EXCEPTION 'shardworker.enqueue: queue name % holds a comma, a control character or white space at '
                        'an end, which run --queues cannot name', quote_literal(enqueue.queue) USING ERRCODE = '22023';
    END IF;
    IF enqueue.priority IS NULL THEN
        RAISE EXCEPTION 'shardworker.enqueue: priority must be an integer' USING ERRCODE = '22023';
    END IF;
    IF enqueue.max_attempts IS NULL OR enqueue.max_attempts < 1 THEN
        RAISE EXCEPTION 'shardworker.enqueue: max_attempts must be an integer from 1 to 2147483647'
            USING ERRCODE = '22023';
    END IF;
    IF enqueue.dedupe_key IS NOT NULL AND btrim(enqueue.dedupe_key) = '' THEN
        RAISE EXCEPTION 'shardworker.enqueue: dedupe_key must not be empty or white space only (NULL: none)'
            USING ERRCODE = '22023';
    END IF;
    IF octet_length(enqueue.dedupe_key) > 1024 THEN
        RAISE EXCEPTION 'shardworker.enqueue: dedupe_key is % bytes of UTF-8, the limit is 1024',
            octet_length(enqueue.dedupe_key) USING ERRCODE = '22023';
    END IF;
    IF enqueue.key IS NOT NULL AND btrim(enqueue.key) = '' THEN
        RAISE EXCEPTION 'shardworker.enqueue: key must not be empty or white space only (NULL: no one''s)'
            USING ERRCODE = '22023';
    END IF;
    IF octet_length(enqueue.key) > 255 THEN
        RAISE EXCEPTION 'shardworker.enqueue: key is % bytes of UTF-8, the limit is 255',
            octet_length(enqueue.key) USING ERRCODE = '22023';
    END IF;
    IF enqueue.delay_s IS NULL OR enqueue.delay_s = 'NaN' OR enqueue.delay_s < 0
       OR enqueue.delay_s > 100 * 365.25 * 86400 THEN
        RAISE EXCEPTION 'shardworker.enqueue: delay_s must be seconds from 0 to 100 years, not %', enqueue.delay_s
            USING ERRCODE = '22023';
    END IF;
    IF cardinality(enqueue.tags) > 20 THEN
        RAISE EXCEPTION 'shardworker.enqueue: % tags, the most a job may carry is 20', cardinality(enqueue.tags)
            USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT FROM unnest(enqueue.tags) AS t(tag) WHERE t.tag IS NULL OR btrim(t.tag) = ''
               OR octet_length(t.tag) > 255) THEN
        RAISE EXCEPTION 'shardworker.enqueue: a tag must be a non-empty string of at most 255 bytes'
            USING ERRCODE = '22023';
    END IF;
    IF octet_length(payload_text) > 64 * 1024 * 1024 THEN
        RAISE EXCEPTION 'shardworker.enqueue: payload too large: % bytes of JSON, the limit is 67108864',
            octet_length(payload_text) USING ERRCODE = '22023';
    END IF;
    INSERT INTO shardworker.jobs (kind, queue, payload, payload_bytes, priority, max_attempts, run_at, dedupe_key, key,
                                  tags)
    VALUES (enqueue.kind, enqueue.queue, payload_text::jsonb, octet_length(payload_text), enqueue.priority,
            enqueue.max_attempts, coalesce(enqueue.run_at, now()) + make_interval(secs => enqueue.delay_s),
            enqueue.dedupe_key, enqueue.key,
            (SELECT array_agg(DISTINCT t) FROM unnest(enqueue.tags) AS t WHERE cardinality(enqueue.tags) > 0))
    ON CONFLICT (dedupe_key) WHERE dedupe_key IS NOT NULL AND status IN ('waiting', 'queued', 'running') DO NOTHING
    RETURNING id INTO new_id;
    IF new_id IS NOT NULL THEN
        PERFORM pg_notify('shardworker_jobs', enqueue.queue);
    END IF;
    RETURN new_id;
END $$;
