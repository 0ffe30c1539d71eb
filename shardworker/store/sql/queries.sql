-- migration_lock --
-- One migration at a time across `shardworker migrate` runs: a transaction advisory lock
-- ("SHAW"), taken by each migration's own transaction, so it holds through a transaction
-- pool (PgBouncer) too, where a session lock would stay behind on a pooled server connection.
SELECT pg_advisory_xact_lock(1397244247);

-- migration_table_exists --
-- Whether the ledger of applied migrations exists (migration 0001 creates it).
SELECT to_regclass('shardworker.migrations') IS NOT NULL;

-- migration_versions --
-- Versions applied so far.
SELECT version FROM shardworker.migrations;

-- migration_record --
-- Record one applied migration, in the transaction that applied it.
INSERT INTO shardworker.migrations (version, name) VALUES (%(version)s, %(name)s);

-- flow_lock_kinds --
-- The first statement of a claim's transaction: lock the rows of this worker's kinds
-- limited across workers (shardworker.kinds), in name order, so the claim that follows
-- counts what runs and spends tokens alone. Then flow_lock_queues, then job_claim: every
-- claimer takes the locks in the same order.
SELECT name FROM shardworker.kinds
WHERE name = ANY(%(kinds)s::text[])
  AND (global_concurrency IS NOT NULL OR rate_limit IS NOT NULL OR key_concurrency IS NOT NULL)
ORDER BY name
FOR UPDATE;

-- flow_lock_queues --
-- The second statement of a claim's transaction: lock the rows of limited queues.
SELECT name FROM shardworker.queues
WHERE (concurrency IS NOT NULL OR rate_limit IS NOT NULL OR key_concurrency IS NOT NULL)
  AND (%(queues)s::text[] IS NULL OR name = ANY(%(queues)s::text[]))
ORDER BY name
FOR UPDATE;

-- job_claim --
-- Claim due queued jobs for one worker, best first (priority, then run_at, then id), within
-- every limit: up to `limit` jobs and `max_bytes` of payload (the first job whatever its
-- size); per kind, what this worker's caps leave (cap_kinds, cap_rooms); for kinds and
-- queues limited across workers (shardworker.kinds, shardworker.queues, their rows locked
-- by flow_lock_kinds and flow_lock_queues earlier in this transaction), no more than
-- `run_room` (what this worker can start now), what their global concurrency leaves of
-- their running jobs (those of a worker silent past its --release-slots-after count no
-- more), and the whole tokens of their rate bucket (refilled at rate_limit
-- per rate_period_s, holding at most a twentieth of rate_limit, at least one, and half a
-- token more: a claim that comes a little after a token fell due loses no time, and the
-- whole tokens stay the burst; see shardworker.core.flow). Paused queues are skipped. A limited kind or queue is
-- read apart from the rest, so jobs that cannot start never crowd out jobs that can.
-- (NOT IN over a subquery, never <> ALL(ARRAY(...)): the planner reads the array as a
-- filter that keeps one row, and sorts the whole queue instead of walking jobs_claim_idx.)
-- The candidates stay locked only for this statement; the ids go through ARRAY(...) so
-- the update is by primary key. Each row returned carries pace_s: for a job of a
-- rate-limited kind or queue, how long its bucket takes to refill a burst, and its claim key
-- (priority, run_at). Given a floor (floor_id not NULL), jobs without limits are looked for
-- from that key on: the index scan starts there instead of walking, from the queue's head,
-- the entries of jobs claimed since, which a held xmin horizon keeps (see WorkerQueries).
-- Without one the bound is the smallest key there is: the same condition either way, so the
-- statement's one generic plan (a direct connection keeps the claim prepared) starts its
-- index scan at the floor too. Nothing is claimed while a claim hold is live (shardworker.claim_holds:
-- a worker re-applies what the database lost when it went back in time), nor on another server
-- than the one the worker looked at (`server`, when given: a pooler may have moved to a new
-- server under the same connection; the worker looks first).
WITH hold AS (
    SELECT EXISTS (SELECT FROM shardworker.claim_holds WHERE until > now())
           OR coalesce(%(server)s::text <> shardworker.server_identity(), false) AS held
), limited AS (
    -- The kinds and queues with limits across workers, and what their rate buckets hold now.
    SELECT l.*, greatest(1, ceil(l.rate_limit / 20.0)) * l.rate_period_s / l.rate_limit AS pace_s,
           CASE WHEN l.rate_limit IS NOT NULL THEN  -- (greatest and least skip NULLs)
               least(greatest(1, ceil(l.rate_limit / 20.0)) + 0.5,
                     l.rate_tokens + extract(epoch FROM statement_timestamp() - l.rate_at)
                                     * l.rate_limit / l.rate_period_s) END AS tokens
    FROM (SELECT 'kind' AS scope, name, false AS paused, global_concurrency AS concurrency,
                 rate_limit, rate_period_s, rate_tokens, rate_at, key_concurrency
          FROM shardworker.kinds
          WHERE name = ANY(%(kinds)s::text[])
            AND (global_concurrency IS NOT NULL OR rate_limit IS NOT NULL OR key_concurrency IS NOT NULL)
          UNION ALL
          SELECT 'queue', name, paused, concurrency, rate_limit, rate_period_s, rate_tokens, rate_at, key_concurrency
          FROM shardworker.queues
          WHERE (paused OR concurrency IS NOT NULL OR rate_limit IS NOT NULL OR key_concurrency IS NOT NULL)
            AND (%(queues)s::text[] IS NULL OR name = ANY(%(queues)s::text[]))) l
), released AS (
    -- Workers this one watched stay silent past their --release-slots-after (``released``):
    -- their running jobs hold no slot.
    SELECT unnest(%(released)s::text[]) AS worker_id
), limited_room AS (
    -- What each may start now: no more than run_room, its concurrency less its running jobs
    -- (but those of released workers), and its bucket's whole tokens; none while paused.
    SELECT l.scope, l.name, l.pace_s, l.key_concurrency,
           CASE WHEN l.paused THEN 0 ELSE
               least(%(run_room)s,
                     coalesce(l.concurrency - CASE l.scope
                         WHEN 'kind' THEN (SELECT count(*) FROM shardworker.jobs r WHERE r.status = 'running'
                                           AND left(r.kind, 255) = left(l.name, 255) AND r.kind = l.name
                                           AND NOT EXISTS (SELECT FROM released x WHERE x.worker_id = r.locked_by))
                         ELSE (SELECT count(*) FROM shardworker.jobs r WHERE r.status = 'running'
                               AND left(r.queue, 255) = left(l.name, 255) AND r.queue = l.name
                               AND NOT EXISTS (SELECT FROM released x WHERE x.worker_id = r.locked_by)) END, %(limit)s),
                     coalesce(floor(l.tokens)::int, %(limit)s)) END AS room
    FROM limited l
), kind_room AS (
    -- Limited kinds, and the kinds this worker caps: what each may start now.
    SELECT coalesce(l.name, c.kind) AS kind, l.pace_s, l.key_concurrency,
           least(coalesce(c.room, %(limit)s), coalesce(l.room, %(limit)s)) AS room
    FROM (SELECT * FROM limited_room WHERE scope = 'kind') l
    FULL JOIN unnest(%(cap_kinds)s::text[], %(cap_rooms)s::int[]) AS c(kind, room) ON c.kind = l.name
), queue_room AS (
    SELECT name AS queue, pace_s, room, key_concurrency FROM limited_room WHERE scope = 'queue'
), capped AS (
    -- Keys at their key_concurrency for a kind or queue of this claim (but released workers'
    -- jobs): their jobs are left out of by_kind and by_queue below, so a capped key's backlog
    -- never fills a limited kind's or queue's room while other jobs wait (the walk offers
    -- its jobs again once it has room).
    SELECT 'kind' AS scope, r.kind AS name, r.key
    FROM shardworker.jobs r JOIN kind_room k ON k.kind = r.kind AND k.key_concurrency IS NOT NULL
    WHERE r.status = 'running' AND r.key IS NOT NULL AND NOT EXISTS (SELECT FROM released x WHERE x.worker_id = r.locked_by)
    GROUP BY r.kind, r.key, k.key_concurrency HAVING count(*) >= k.key_concurrency
    UNION ALL
    SELECT 'queue', r.queue, r.key
    FROM shardworker.jobs r JOIN queue_room q ON q.queue = r.queue AND q.key_concurrency IS NOT NULL
    WHERE r.status = 'running' AND r.key IS NOT NULL AND NOT EXISTS (SELECT FROM released x WHERE x.worker_id = r.locked_by)
    GROUP BY r.queue, r.key, q.key_concurrency HAVING count(*) >= q.key_concurrency
), plain AS (
    -- Jobs of kinds and queues without limits (none to look for when every kind has one).
    SELECT id, kind, queue, priority, run_at, key, coalesce(payload_bytes, pg_column_size(payload)) + deps_bytes
           + CASE WHEN attempt > 0 OR steps_ahead THEN shardworker.steps_bytes(id) ELSE 0 END AS bytes
    FROM shardworker.jobs
    WHERE (SELECT count(*) FROM kind_room) < cardinality(%(kinds)s::text[]) AND NOT (SELECT held FROM hold)
      AND status = 'queued' AND run_at <= now()
      AND kind = ANY(%(kinds)s::text[]) AND kind NOT IN (SELECT kind FROM kind_room)
      AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
      AND queue NOT IN (SELECT queue FROM queue_room)
      AND (priority, run_at, id) >= (coalesce(%(floor_priority)s::int, -2147483648),
                                     coalesce(%(floor_run_at)s::timestamptz, '-infinity'),
                                     coalesce(%(floor_id)s::bigint, -9223372036854775808))
    ORDER BY priority, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), by_kind AS (
    -- Each limited kind, in queues without limits: no more than its room.
    SELECT j.* FROM kind_room k CROSS JOIN LATERAL (
        SELECT id, kind, queue, priority, run_at, key, coalesce(payload_bytes, pg_column_size(payload)) + deps_bytes
           + CASE WHEN attempt > 0 OR steps_ahead THEN shardworker.steps_bytes(id) ELSE 0 END AS bytes
        FROM shardworker.jobs
        WHERE status = 'queued' AND run_at <= now() AND left(kind, 255) = left(k.kind, 255) AND kind = k.kind
          AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
          AND queue NOT IN (SELECT queue FROM queue_room)
          AND (jobs.key IS NULL OR NOT EXISTS (SELECT FROM capped c WHERE c.key = jobs.key
               AND ((c.scope = 'kind' AND c.name = jobs.kind) OR (c.scope = 'queue' AND c.name = jobs.queue))))
        ORDER BY priority, run_at, id
        LIMIT k.room
        FOR UPDATE SKIP LOCKED) j
    WHERE k.room > 0 AND NOT (SELECT held FROM hold)
), by_queue AS (
    -- Each limited queue: no more than its room, of kinds with room (ranked again below).
    SELECT j.* FROM queue_room q CROSS JOIN LATERAL (
        SELECT id, kind, queue, priority, run_at, key, coalesce(payload_bytes, pg_column_size(payload)) + deps_bytes
           + CASE WHEN attempt > 0 OR steps_ahead THEN shardworker.steps_bytes(id) ELSE 0 END AS bytes
        FROM shardworker.jobs
        WHERE status = 'queued' AND run_at <= now() AND left(queue, 255) = left(q.queue, 255) AND queue = q.queue
          AND kind = ANY(%(kinds)s::text[]) AND kind NOT IN (SELECT kind FROM kind_room WHERE room <= 0)
          AND (jobs.key IS NULL OR NOT EXISTS (SELECT FROM capped c WHERE c.key = jobs.key
               AND ((c.scope = 'kind' AND c.name = jobs.kind) OR (c.scope = 'queue' AND c.name = jobs.queue))))
        ORDER BY priority, run_at, id
        LIMIT q.room
        FOR UPDATE SKIP LOCKED) j
    WHERE q.room > 0 AND NOT (SELECT held FROM hold)
), walked AS (
    -- The keys this claim serves in turn (a tenant's jobs carry one): from where this
    -- worker's last claim left off (shardworker.key_turns; from the first key after the last),
    -- the next `limit` keys of queued jobs that it can serve (in its queues, its best job due,
    -- room under their key_concurrency), one index probe or two a key (jobs_queued_keys_idx),
    -- never a scan of their backlogs, passing the others (at most 4 x limit + 256 keys in all; a
    -- queue it does not claim from in one probe).
    -- Each key then offers its best due jobs (keyed, below), its share of the claim.
    WITH RECURSIVE walk(step, served, q, k, ok) AS (
        SELECT 1, e.ok::int, p.q, p.k, e.ok
        FROM (SELECT * FROM (
                 (SELECT left(queue, 255) AS q, key AS k FROM shardworker.jobs
                  WHERE status = 'queued' AND key IS NOT NULL
                    AND (left(queue, 255), key) > ((SELECT c.queue FROM shardworker.key_turns c WHERE c.worker_id = %(worker_id)s),
                                                   (SELECT c.key FROM shardworker.key_turns c WHERE c.worker_id = %(worker_id)s))
                  ORDER BY left(queue, 255), key LIMIT 1)
                 UNION ALL
                 (SELECT left(queue, 255), key FROM shardworker.jobs
                  WHERE status = 'queued' AND key IS NOT NULL
                  ORDER BY left(queue, 255), key LIMIT 1)) first LIMIT 1) p
        CROSS JOIN LATERAL (SELECT coalesce((%(queues)s::text[] IS NULL OR p.q = ANY(%(queues)s::text[]))
              AND NOT EXISTS (SELECT FROM capped c WHERE c.scope = 'queue' AND c.name = p.q AND c.key = p.k)
              AND cardinality(%(kinds)s::text[]) > (SELECT count(*) FROM capped c WHERE c.scope = 'kind'
                                                   AND c.key = p.k AND c.name = ANY(%(kinds)s::text[]))
              AND (SELECT run_at FROM shardworker.jobs
                   WHERE status = 'queued' AND key IS NOT NULL
                     AND (left(queue, 255), key, priority, run_at, id)
                         >= (p.q, p.k, coalesce(%(floor_priority)s::int, -2147483648),
                             coalesce(%(floor_run_at)s::timestamptz, '-infinity'),
                             coalesce(%(floor_id)s::bigint, -9223372036854775808))
                     AND (left(queue, 255), key) <= (p.q, p.k)
                   ORDER BY left(queue, 255), key, priority, run_at, id LIMIT 1) <= now(), false) AS ok) e
        UNION ALL
        SELECT w.step + 1, w.served + e.ok::int, p.q, p.k, e.ok
        FROM walk w CROSS JOIN LATERAL (
            SELECT * FROM (
                (SELECT left(queue, 255) AS q, key AS k FROM shardworker.jobs
                 WHERE (%(queues)s::text[] IS NULL OR w.q = ANY(%(queues)s::text[]))
                   AND status = 'queued' AND key IS NOT NULL AND (left(queue, 255), key) > (w.q, w.k)
                 ORDER BY left(queue, 255), key LIMIT 1)
                UNION ALL  -- a queue this worker does not claim from: on to the next queue at once
                (SELECT left(queue, 255), key FROM shardworker.jobs
                 WHERE NOT (%(queues)s::text[] IS NULL OR w.q = ANY(%(queues)s::text[]))
                   AND status = 'queued' AND key IS NOT NULL AND left(queue, 255) > w.q
                 ORDER BY left(queue, 255), key LIMIT 1)) next LIMIT 1) p
        CROSS JOIN LATERAL (SELECT coalesce((%(queues)s::text[] IS NULL OR p.q = ANY(%(queues)s::text[]))
              AND NOT EXISTS (SELECT FROM capped c WHERE c.scope = 'queue' AND c.name = p.q AND c.key = p.k)
              AND cardinality(%(kinds)s::text[]) > (SELECT count(*) FROM capped c WHERE c.scope = 'kind'
                                                   AND c.key = p.k AND c.name = ANY(%(kinds)s::text[]))
              AND (SELECT run_at FROM shardworker.jobs
                   WHERE status = 'queued' AND key IS NOT NULL
                     AND (left(queue, 255), key, priority, run_at, id)
                         >= (p.q, p.k, coalesce(%(floor_priority)s::int, -2147483648),
                             coalesce(%(floor_run_at)s::timestamptz, '-infinity'),
                             coalesce(%(floor_id)s::bigint, -9223372036854775808))
                     AND (left(queue, 255), key) <= (p.q, p.k)
                   ORDER BY left(queue, 255), key, priority, run_at, id LIMIT 1) <= now(), false) AS ok) e
        WHERE w.served < %(limit)s AND w.step < 4 * %(limit)s + 256
    )
    SELECT step, served, q, k, ok FROM walk WHERE NOT (SELECT held FROM hold)
), turn AS (
    SELECT served AS n, q, k FROM walked WHERE ok
), turned AS (
    INSERT INTO shardworker.key_turns AS c (worker_id, queue, key)
    SELECT %(worker_id)s, q, k FROM walked ORDER BY step DESC LIMIT 1
    ON CONFLICT (worker_id) DO UPDATE SET queue = excluded.queue, key = excluded.key
    WHERE (c.queue, c.key) IS DISTINCT FROM (excluded.queue, excluded.key)  -- (no write for the same place)
), keyed AS (
    SELECT t.n AS walk, j.* FROM turn t CROSS JOIN LATERAL (
        SELECT id, kind, queue, priority, run_at, key, coalesce(payload_bytes, pg_column_size(payload)) + deps_bytes
           + CASE WHEN attempt > 0 OR steps_ahead THEN shardworker.steps_bytes(id) ELSE 0 END AS bytes
        FROM shardworker.jobs
        -- (the key's jobs as a range of jobs_queued_keys_idx, in its order: an equality would let
        -- the planner sort the key's backlog from another index instead)
        WHERE status = 'queued' AND key IS NOT NULL
          AND (left(queue, 255), key, priority, run_at, id) >= (t.q, t.k, coalesce(%(floor_priority)s::int, -2147483648),
              coalesce(%(floor_run_at)s::timestamptz, '-infinity'),
              coalesce(%(floor_id)s::bigint, -9223372036854775808))
          AND (left(queue, 255), key) <= (t.q, t.k)
          AND run_at <= now() AND kind = ANY(%(kinds)s::text[])
          AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
        ORDER BY left(queue, 255), key, priority, run_at, id
        LIMIT greatest(1, %(limit)s / (SELECT count(*) FROM turn)) * shardworker.key_weight(t.q, t.k)
        FOR UPDATE SKIP LOCKED) j
), candidate AS (
    SELECT DISTINCT ON (id) * FROM (
        SELECT NULL::int AS walk, u.* FROM (SELECT * FROM plain UNION ALL SELECT * FROM by_kind
                                            UNION ALL SELECT * FROM by_queue) u
        UNION ALL SELECT * FROM keyed) c
    ORDER BY id, walk NULLS LAST
), key_room AS (
    -- What key_concurrency leaves each key of the candidates, for their kind and their queue:
    -- its limit less the key's running jobs (but those of released workers).
    SELECT c.kind, c.queue, c.key,
           k.key_concurrency - (SELECT count(*) FROM shardworker.jobs r WHERE r.status = 'running'
                                AND r.key = c.key AND r.kind = c.kind
                                AND NOT EXISTS (SELECT FROM released x WHERE x.worker_id = r.locked_by)) AS kind_room,
           q.key_concurrency - (SELECT count(*) FROM shardworker.jobs r WHERE r.status = 'running'
                                AND r.key = c.key AND r.queue = c.queue
                                AND NOT EXISTS (SELECT FROM released x WHERE x.worker_id = r.locked_by)) AS queue_room
    FROM (SELECT DISTINCT kind, queue, key FROM candidate WHERE key IS NOT NULL) c
    LEFT JOIN kind_room k ON k.kind = c.kind LEFT JOIN queue_room q ON q.queue = c.queue
), within_key AS (
    -- Within key_concurrency; then each key's first job before any key's second (the jobs
    -- without a key count as one key), the keys in turn before the others.
    SELECT c.*, ceil(row_number() OVER (PARTITION BY c.key ORDER BY c.priority, c.run_at, c.id)::numeric
                     / CASE WHEN c.key IS NULL THEN 1 ELSE shardworker.key_weight(c.queue, c.key) END) AS nth,  -- weight 3: 3 a round
           CASE WHEN c.key IS NULL THEN 0 ELSE c.walk END AS turn  -- the jobs without a key: a turn every claim
    FROM (SELECT c.*, row_number() OVER (PARTITION BY c.kind, c.key ORDER BY c.priority, c.run_at, c.id) AS nth_kind,
                 row_number() OVER (PARTITION BY c.queue, c.key ORDER BY c.priority, c.run_at, c.id) AS nth_queue,
                 r.kind_room, r.queue_room
          FROM candidate c LEFT JOIN key_room r ON (r.kind, r.queue, r.key) = (c.kind, c.queue, c.key)) c
    WHERE (c.kind_room IS NULL OR c.nth_kind <= c.kind_room) AND (c.queue_room IS NULL OR c.nth_queue <= c.queue_room)
), within_kind AS (
    -- Within the kinds' and the queues' rooms, taken in that order.
    SELECT c.* FROM (
        SELECT c.*, row_number() OVER (PARTITION BY c.kind ORDER BY c.priority, c.nth, c.turn, c.run_at, c.id) AS nth_k,
               row_number() OVER (PARTITION BY c.queue ORDER BY c.priority, c.nth, c.turn, c.run_at, c.id) AS nth_q,
               k.room AS k_room, q.room AS q_room
        FROM within_key c LEFT JOIN kind_room k ON k.kind = c.kind LEFT JOIN queue_room q ON q.queue = c.queue) c
    WHERE (c.k_room IS NULL OR c.nth_k <= c.k_room) AND (c.q_room IS NULL OR c.nth_q <= c.q_room)
), running_total AS (
    SELECT id, row_number() OVER w AS n, sum(bytes) OVER w AS upto
    FROM within_kind
    WINDOW w AS (ORDER BY priority, nth, turn, run_at, id)
), claimed AS (
    UPDATE shardworker.jobs j
    SET status = 'running', attempt = j.attempt + 1, locked_by = %(worker_id)s, rescued_attempt = NULL,
        claim_token = %(claim_token)s, attempted_at = now(), updated_at = now(),
        -- The first claim makes the handler's own max_attempts (attempt_kinds, attempt_limits)
        -- the row's when it is lower: from then on the row is the one limit everything reads.
        max_attempts = CASE WHEN j.attempt = 0 THEN least(j.max_attempts, (
                           SELECT a.n FROM unnest(%(attempt_kinds)s::text[], %(attempt_limits)s::int[]) AS a(kind, n)
                           WHERE a.kind = j.kind)) ELSE j.max_attempts END
    WHERE j.id = ANY(ARRAY(SELECT id FROM running_total WHERE n <= %(limit)s AND (n = 1 OR upto <= %(max_bytes)s)))
    -- The size of the steps earlier attempts recorded (job.step): only a retried job can have
    -- any (or one whose steps are ahead of its row: steps_ahead, migration 0017), so a first
    -- attempt costs nothing here; and of the results of the jobs it waited on (after=). The
    -- select below gathers both as JSON text, unless together they are over max_input_bytes:
    -- then it returns their sizes instead, and the worker fails that job for good (a claim
    -- that tried to gather them would fail whole, for every job, on every retry).
    RETURNING j.id, j.kind, j.queue, j.payload::text AS payload, j.attempt, j.max_attempts, j.snoozes,
              j.priority, j.run_at,
              CASE WHEN j.attempt > 1 OR j.steps_ahead THEN shardworker.steps_bytes(j.id) END AS steps_bytes,
              CASE WHEN j.deps_total > 0 THEN j.deps_bytes END AS deps_bytes,
              j.uid, j.key, j.trace::text AS trace
), spent_kind AS (
    UPDATE shardworker.kinds k
    SET rate_tokens = l.tokens - (SELECT count(*) FROM claimed c WHERE c.kind = l.name),
        rate_at = statement_timestamp()
    FROM limited l
    WHERE l.scope = 'kind' AND k.name = l.name AND l.rate_limit IS NOT NULL
), spent_queue AS (
    UPDATE shardworker.queues q
    SET rate_tokens = l.tokens - (SELECT count(*) FROM claimed c WHERE c.queue = l.name),
        rate_at = statement_timestamp()
    FROM limited l
    WHERE l.scope = 'queue' AND q.name = l.name AND l.rate_limit IS NOT NULL AND NOT l.paused
)
SELECT c.id, c.kind, c.queue, c.payload, c.attempt, c.max_attempts, c.snoozes,
       least((SELECT k.pace_s FROM kind_room k WHERE k.kind = c.kind),
             (SELECT q.pace_s FROM queue_room q WHERE q.queue = c.queue)) AS pace_s,
       CASE WHEN c.steps_bytes IS NOT NULL AND NOT c.over THEN shardworker.steps_json(c.id) END AS steps,
       CASE WHEN c.deps_bytes IS NOT NULL AND NOT c.over THEN shardworker.dependencies_json(c.id) END AS dependencies,
       c.priority, c.run_at, c.uid,
       CASE WHEN c.over THEN coalesce(c.steps_bytes, 0) END, CASE WHEN c.over THEN coalesce(c.deps_bytes, 0) END, c.key,
       f.priority, f.run_at, f.id, c.trace
FROM (SELECT *, coalesce(steps_bytes, 0) + coalesce(deps_bytes, 0) > %(max_input_bytes)s AS over FROM claimed) c
-- The first candidate's claim key: where the next claim may start when keys took turns (every
-- job before it was claimed or locked by another claimer; shardworker.store.claim_floor).
LEFT JOIN (SELECT priority, run_at, id FROM candidate ORDER BY priority, run_at, id LIMIT 1) f ON true;

-- job_claim_plain --
-- job_claim for the common case, one statement in a transaction of its own: a worker with no
-- caps of its own (the caller knows) whose kinds are not limited across workers and whose
-- queues are neither limited nor paused (checked here, in this statement's snapshot). Then
-- nothing needs locking or counting: the claim is job_claim's `plain` part with its keys'
-- turns, and half of job_claim's cost to the server and to the worker. Where some limit is in
-- the way it claims nothing and returns one row whose id is NULL: the caller runs job_claim
-- instead. Its columns, the update and what it returns are job_claim's (keep the two in step:
-- tests/store/test_claim_paths.py compares them), pace_s always NULL.
WITH flow AS (
    SELECT EXISTS (SELECT FROM shardworker.kinds
                   WHERE name = ANY(%(kinds)s::text[])
                     AND (global_concurrency IS NOT NULL OR rate_limit IS NOT NULL OR key_concurrency IS NOT NULL))
        OR EXISTS (SELECT FROM shardworker.queues
                   WHERE (paused OR concurrency IS NOT NULL OR rate_limit IS NOT NULL OR key_concurrency IS NOT NULL)
                     AND (%(queues)s::text[] IS NULL OR name = ANY(%(queues)s::text[]))) AS limited
), hold AS (
    SELECT (SELECT limited FROM flow)
           OR EXISTS (SELECT FROM shardworker.claim_holds WHERE until > now())  -- as job_claim's hold
           OR coalesce(%(server)s::text <> shardworker.server_identity(), false) AS held
), walked AS (
    -- As job_claim's walk: the keys this claim serves in turn. (Written here again rather than
    -- left to job_claim: sending every claim with keys queued the full way cost a tenant's
    -- backlog 31% of its throughput in bench/tenants.py, against 5% with the walk here.)
    WITH RECURSIVE walk(step, served, q, k, ok) AS (
        SELECT 1, e.ok::int, p.q, p.k, e.ok
        FROM (SELECT * FROM (
                 (SELECT left(queue, 255) AS q, key AS k FROM shardworker.jobs
                  WHERE status = 'queued' AND key IS NOT NULL
                    AND (left(queue, 255), key) > ((SELECT c.queue FROM shardworker.key_turns c WHERE c.worker_id = %(worker_id)s),
                                                   (SELECT c.key FROM shardworker.key_turns c WHERE c.worker_id = %(worker_id)s))
                  ORDER BY left(queue, 255), key LIMIT 1)
                 UNION ALL
                 (SELECT left(queue, 255), key FROM shardworker.jobs
                  WHERE status = 'queued' AND key IS NOT NULL
                  ORDER BY left(queue, 255), key LIMIT 1)) first LIMIT 1) p
        CROSS JOIN LATERAL (SELECT coalesce((%(queues)s::text[] IS NULL OR p.q = ANY(%(queues)s::text[]))
              AND (SELECT run_at FROM shardworker.jobs
                   WHERE status = 'queued' AND key IS NOT NULL
                     AND (left(queue, 255), key, priority, run_at, id)
                         >= (p.q, p.k, coalesce(%(floor_priority)s::int, -2147483648),
                             coalesce(%(floor_run_at)s::timestamptz, '-infinity'),
                             coalesce(%(floor_id)s::bigint, -9223372036854775808))
                     AND (left(queue, 255), key) <= (p.q, p.k)
                   ORDER BY left(queue, 255), key, priority, run_at, id LIMIT 1) <= now(), false) AS ok) e
        UNION ALL
        SELECT w.step + 1, w.served + e.ok::int, p.q, p.k, e.ok
        FROM walk w CROSS JOIN LATERAL (
            SELECT * FROM (
                (SELECT left(queue, 255) AS q, key AS k FROM shardworker.jobs
                 WHERE (%(queues)s::text[] IS NULL OR w.q = ANY(%(queues)s::text[]))
                   AND status = 'queued' AND key IS NOT NULL AND (left(queue, 255), key) > (w.q, w.k)
                 ORDER BY left(queue, 255), key LIMIT 1)
                UNION ALL  -- a queue this worker does not claim from: on to the next queue at once
                (SELECT left(queue, 255), key FROM shardworker.jobs
                 WHERE NOT (%(queues)s::text[] IS NULL OR w.q = ANY(%(queues)s::text[]))
                   AND status = 'queued' AND key IS NOT NULL AND left(queue, 255) > w.q
                 ORDER BY left(queue, 255), key LIMIT 1)) next LIMIT 1) p
        CROSS JOIN LATERAL (SELECT coalesce((%(queues)s::text[] IS NULL OR p.q = ANY(%(queues)s::text[]))
              AND (SELECT run_at FROM shardworker.jobs
                   WHERE status = 'queued' AND key IS NOT NULL
                     AND (left(queue, 255), key, priority, run_at, id)
                         >= (p.q, p.k, coalesce(%(floor_priority)s::int, -2147483648),
                             coalesce(%(floor_run_at)s::timestamptz, '-infinity'),
                             coalesce(%(floor_id)s::bigint, -9223372036854775808))
                     AND (left(queue, 255), key) <= (p.q, p.k)
                   ORDER BY left(queue, 255), key, priority, run_at, id LIMIT 1) <= now(), false) AS ok) e
        WHERE w.served < %(limit)s AND w.step < 4 * %(limit)s + 256
    )
    SELECT step, served, q, k, ok FROM walk WHERE NOT (SELECT held FROM hold)
), turn AS (
    SELECT served AS n, q, k FROM walked WHERE ok
), turned AS (
    INSERT INTO shardworker.key_turns AS c (worker_id, queue, key)
    SELECT %(worker_id)s, q, k FROM walked ORDER BY step DESC LIMIT 1
    ON CONFLICT (worker_id) DO UPDATE SET queue = excluded.queue, key = excluded.key
    WHERE (c.queue, c.key) IS DISTINCT FROM (excluded.queue, excluded.key)  -- (no write for the same place)
), candidate AS (
    -- The best jobs, and each key's in turn its share of the claim: the keys take turns.
    SELECT DISTINCT ON (id) * FROM (
        SELECT NULL::int AS walk, * FROM (
            SELECT id, queue, priority, run_at, key, coalesce(payload_bytes, pg_column_size(payload)) + deps_bytes
                   + CASE WHEN attempt > 0 OR steps_ahead THEN shardworker.steps_bytes(id) ELSE 0 END AS bytes
            FROM shardworker.jobs
            WHERE NOT (SELECT held FROM hold)
              AND status = 'queued' AND run_at <= now() AND kind = ANY(%(kinds)s::text[])
              AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
              AND (priority, run_at, id) >= (coalesce(%(floor_priority)s::int, -2147483648),
                                             coalesce(%(floor_run_at)s::timestamptz, '-infinity'),
                                             coalesce(%(floor_id)s::bigint, -9223372036854775808))
            ORDER BY priority, run_at, id
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED) best
        UNION ALL
        SELECT t.n, j.* FROM turn t CROSS JOIN LATERAL (
            SELECT id, queue, priority, run_at, key, coalesce(payload_bytes, pg_column_size(payload)) + deps_bytes
                   + CASE WHEN attempt > 0 OR steps_ahead THEN shardworker.steps_bytes(id) ELSE 0 END AS bytes
            FROM shardworker.jobs
            -- (the key's jobs as a range of jobs_queued_keys_idx, in its order: an equality would let
        -- the planner sort the key's backlog from another index instead)
        WHERE status = 'queued' AND key IS NOT NULL
          AND (left(queue, 255), key, priority, run_at, id) >= (t.q, t.k, coalesce(%(floor_priority)s::int, -2147483648),
              coalesce(%(floor_run_at)s::timestamptz, '-infinity'),
              coalesce(%(floor_id)s::bigint, -9223372036854775808))
          AND (left(queue, 255), key) <= (t.q, t.k)
              AND run_at <= now() AND kind = ANY(%(kinds)s::text[])
              AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
            ORDER BY left(queue, 255), key, priority, run_at, id
            LIMIT greatest(1, %(limit)s / (SELECT count(*) FROM turn)) * shardworker.key_weight(t.q, t.k)
            FOR UPDATE SKIP LOCKED) j
    ) c
    ORDER BY id, walk NULLS LAST
), running_total AS (
    -- Priority first; then each key's first job before any key's second (the jobs without a
    -- key count as one key, which has a turn in every claim), the keys in turn before the others.
    SELECT id, row_number() OVER w AS n, sum(bytes) OVER w AS upto
    FROM (SELECT *, ceil(row_number() OVER (PARTITION BY key ORDER BY priority, run_at, id)::numeric
                         / CASE WHEN key IS NULL THEN 1 ELSE shardworker.key_weight(queue, key) END) AS nth,
                 CASE WHEN key IS NULL THEN 0 ELSE walk END AS turn FROM candidate) c
    WINDOW w AS (ORDER BY priority, nth, turn NULLS LAST, run_at, id)
), claimed AS (
    UPDATE shardworker.jobs j
    SET status = 'running', attempt = j.attempt + 1, locked_by = %(worker_id)s, rescued_attempt = NULL,
        claim_token = %(claim_token)s, attempted_at = now(), updated_at = now(),
        max_attempts = CASE WHEN j.attempt = 0 THEN least(j.max_attempts, (
                           SELECT a.n FROM unnest(%(attempt_kinds)s::text[], %(attempt_limits)s::int[]) AS a(kind, n)
                           WHERE a.kind = j.kind)) ELSE j.max_attempts END
    WHERE j.id = ANY(ARRAY(SELECT id FROM running_total WHERE n <= %(limit)s AND (n = 1 OR upto <= %(max_bytes)s)))
    RETURNING j.id, j.kind, j.queue, j.payload::text AS payload, j.attempt, j.max_attempts, j.snoozes,
              NULL::numeric AS pace_s,
              CASE WHEN j.attempt > 1 OR j.steps_ahead THEN shardworker.steps_bytes(j.id) END AS steps_bytes,
              CASE WHEN j.deps_total > 0 THEN j.deps_bytes END AS deps_bytes,
              j.priority, j.run_at, j.uid, j.key, j.trace::text AS trace
)
SELECT c.id, c.kind, c.queue, c.payload, c.attempt, c.max_attempts, c.snoozes, c.pace_s,
       CASE WHEN c.steps_bytes IS NOT NULL AND NOT c.over THEN shardworker.steps_json(c.id) END AS steps,
       CASE WHEN c.deps_bytes IS NOT NULL AND NOT c.over THEN shardworker.dependencies_json(c.id) END AS dependencies,
       c.priority, c.run_at, c.uid,
       CASE WHEN c.over THEN coalesce(c.steps_bytes, 0) END, CASE WHEN c.over THEN coalesce(c.deps_bytes, 0) END, c.key,
       f.priority, f.run_at, f.id, c.trace
FROM (SELECT *, coalesce(steps_bytes, 0) + coalesce(deps_bytes, 0) > %(max_input_bytes)s AS over FROM claimed) c
-- The first candidate's claim key: where the next claim may start when keys took turns (every
-- job before it was claimed or locked by another claimer; shardworker.store.claim_floor).
LEFT JOIN (SELECT priority, run_at, id FROM candidate ORDER BY priority, run_at, id LIMIT 1) f ON true
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL
WHERE (SELECT limited FROM flow);

-- flow_register_kinds --
-- At a worker's start: its handlers' limits across workers become the kinds' rows (the
-- last worker to start sets them); kinds it handles without such limits lose theirs.
INSERT INTO shardworker.kinds AS k (name, global_concurrency, rate_limit, rate_period_s, key_concurrency)
SELECT name, gc, rl, rp, kc
FROM unnest(%(names)s::text[], %(global_concurrency)s::int[], %(rate_limit)s::int[], %(rate_period_s)s::float8[],
            %(key_concurrency)s::int[])
     AS r(name, gc, rl, rp, kc)
ORDER BY name
ON CONFLICT (name) DO UPDATE
SET global_concurrency = EXCLUDED.global_concurrency, rate_limit = EXCLUDED.rate_limit,
    rate_period_s = EXCLUDED.rate_period_s, key_concurrency = EXCLUDED.key_concurrency, updated_at = now(),
    rate_tokens = CASE WHEN k.rate_limit IS NOT DISTINCT FROM EXCLUDED.rate_limit
                        AND k.rate_period_s IS NOT DISTINCT FROM EXCLUDED.rate_period_s
                       THEN k.rate_tokens ELSE 0 END
WHERE (k.global_concurrency, k.rate_limit, k.rate_period_s, k.key_concurrency)
      IS DISTINCT FROM (EXCLUDED.global_concurrency, EXCLUDED.rate_limit, EXCLUDED.rate_period_s,
                        EXCLUDED.key_concurrency);

-- job_apply_outcomes --
-- Apply a batch of outcomes, fenced: only the claim that produced an outcome (its attempt,
-- and its claim token when the outcome carries one: another worker's claim of the same
-- attempt number, made after the database went back in time, is not it), of the same job
-- (its uid when both have one: the id may have gone to another job since), while it is
-- still running, or while it waits rescued and not yet claimed again (a late outcome from a
-- host that was stopped or cut off lands instead of the job running again); or, when the
-- database went back to before the claim itself (a failover to a replica that lagged, a
-- restore), the row as it was before that claim (queued, waiting, or still running an older
-- attempt: a later attempt's outcome proves the earlier ones ended; this attempt's outcome
-- never applied): the handler's run is the attempt, and it lands. (An older attempt's outcome
-- re-applied after a later one is then stale.)
-- Returns the rows applied; an outcome missing from the result was applied before (a
-- replay), its attempt lost its lease (stale), or its job does not exist: see job_classify.
-- disposition (shardworker.core.model.Disposition): 'done'; 'retry' (queued again after
-- delay_s while attempts remain, else failed); 'failed' (for good: max_attempts becomes the
-- attempts it used); 'snoozed' (queued again after delay_s; snoozes grows by one, so no
-- attempt is used: attempts used are attempt - snoozes); 'suspended' (waiting, a snooze's
-- attempt: a sleep or a wait for an event, written next by shardworker.begin_wait);
-- 'cancelled'. Jobs that reach an end (done, failed, cancelled) are
-- announced on the channel shardworker_finished (shardworker.jobs.wait_for listens), their
-- ids comma-separated, up to 300 a notification (within the 8,000-byte payload limit).
-- RETURNING has_dependents: whether job_dependents_cancel or job_dependents_release must look for jobs waiting on it.
-- Without `settles` a job with dependents is left alone (as if the outcome were stale): the
-- batch then commits in the same round trip, and the caller applies those outcomes again
-- with `settles`, in a transaction that settles their dependents.
-- A failed attempt (retry, failed) is added to errors, the job's history of its last
-- failures (migration 0012; how many: shardworker.core.limits.ERRORS_KEPT), with its traceback
-- and when it failed (NaN: unknown, then now()); last_error holds its message and
-- traceback as one text.
-- With mark_outbox, the outbox's mark is checked (the database must hold mark_expect, else
-- the statement fails: it went back in time); with mark_write 'if_all' it advances to
-- mark_batch and mark_positions (shardworker.outbox_mark) in this transaction if every
-- outcome of the batch was applied here (if not, the caller applies the rest in a transaction
-- that writes the mark); with 'never' the caller writes it later in this transaction.
-- Parameters come in binary; results as bytea holding UTF-8 JSON text.
WITH o AS (
    SELECT id, attempt, disposition, convert_from(result_utf8, 'UTF8')::jsonb AS result, error, delay_s,
           traceback, CASE WHEN failed_at = 'NaN' THEN now() ELSE to_timestamp(failed_at) END AS failed_at,
           uid, token
    FROM unnest(%(ids)b::bigint[], %(attempts)b::int[], %(dispositions)b::text[],
                %(results)b::bytea[], %(errors)b::text[], %(delays)b::float8[], %(tracebacks)b::text[],
                %(failed_at)b::float8[], %(uids)b::bigint[], %(tokens)b::text[])
        AS o(id, attempt, disposition, result_utf8, error, delay_s, traceback, failed_at, uid, token)
), applied AS (
    UPDATE shardworker.jobs j
    SET status = CASE WHEN o.disposition = 'done' THEN 'done'
                      WHEN o.disposition = 'snoozed' THEN 'queued'
                      WHEN o.disposition = 'suspended' THEN 'waiting'
                      WHEN o.disposition = 'cancelled' THEN 'cancelled'
                      WHEN o.disposition = 'retry' AND o.attempt - j.snoozes < j.max_attempts THEN 'queued'
                      ELSE 'failed' END,
        attempt = o.attempt, claim_token = coalesce(o.token, j.claim_token),
        result = CASE WHEN o.disposition = 'done' THEN o.result ELSE j.result END,
        last_error = CASE WHEN o.disposition IN ('retry', 'failed', 'cancelled')
                          THEN o.error || coalesce(E'\n' || o.traceback, '') ELSE j.last_error END,
        errors = CASE WHEN o.disposition IN ('retry', 'failed') THEN (
            SELECT jsonb_agg(e ORDER BY n)
            FROM jsonb_array_elements(j.errors || jsonb_build_array(jsonb_build_object(
                     'attempt', o.attempt, 'error', left(o.error, %(error_chars)s::int), 'traceback', o.traceback,
                     'at', to_char(o.failed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'))))
                 WITH ORDINALITY AS e(e, n)
            WHERE n > jsonb_array_length(j.errors) + 1 - %(errors_kept)s::int) ELSE j.errors END,
        -- A snooze uses no attempt; a failure the handler ends (Fail) uses the job's last, so
        -- the row reads "3/3", not "3/25".
        snoozes = CASE WHEN o.disposition IN ('snoozed', 'suspended') THEN j.snoozes + 1 ELSE j.snoozes END,
        max_attempts = CASE WHEN o.disposition = 'failed' THEN LEAST(j.max_attempts, o.attempt - j.snoozes)
                            ELSE j.max_attempts END,
        run_at = CASE WHEN o.disposition = 'snoozed'
                           OR (o.disposition = 'retry' AND o.attempt - j.snoozes < j.max_attempts)
                      THEN now() + make_interval(secs => o.delay_s) ELSE j.run_at END,
        finished_at = CASE WHEN o.disposition IN ('snoozed', 'suspended')
                                OR (o.disposition = 'retry' AND o.attempt - j.snoozes < j.max_attempts)
                           THEN NULL ELSE now() END,
        -- What a suspended job waits on is written next (shardworker.begin_wait); any other
        -- outcome ends every wait.
        wait_kind = NULL, wait_name = NULL, wait_key = NULL, wait_until = NULL, wait_since = NULL,
        locked_by = NULL, applied_attempt = o.attempt, rescued_attempt = NULL, updated_at = now()
    FROM o
    WHERE j.id = o.id AND (o.uid IS NULL OR j.uid IS NULL OR j.uid = o.uid)
      AND ((j.attempt = o.attempt AND (o.token IS NULL OR j.claim_token IS NULL OR j.claim_token = o.token)
            AND (j.status = 'running' OR (j.rescued_attempt = o.attempt AND j.status IN ('queued', 'failed'))))
           OR (o.uid IS NOT NULL AND j.attempt < o.attempt AND j.status IN ('queued', 'waiting', 'running')
               AND coalesce(j.applied_attempt, 0) < o.attempt))
      AND (%(settles)s::boolean OR NOT j.has_dependents)
    RETURNING j.id, j.attempt, j.status, j.has_dependents
), marked AS (
    SELECT shardworker.outbox_mark(%(mark_outbox)s::text, %(mark_worker)s::text, %(mark_batch)s::bigint,
                                   convert_from(%(mark_positions)s::bytea, 'UTF8')::jsonb, %(mark_expect)s::bigint,
                                   %(mark_write)s::text = 'if_all'
                                   AND (SELECT count(*) FROM applied) = cardinality(%(ids)b::bigint[]))
    WHERE %(mark_outbox)s::text IS NOT NULL
), announced AS (
    SELECT shardworker.notify_finished(array_agg(id)) AS sent
    FROM applied WHERE status IN ('done', 'failed', 'cancelled')
)
SELECT id, attempt, status, has_dependents FROM applied
WHERE (SELECT count(*) FROM announced) >= 0 AND (SELECT count(*) FROM marked) >= 0;

-- job_steps_insert --
-- Record steps' results (job.step), in the transaction that applies the outcomes of the same
-- batch. The first result recorded under a name wins: a step result is a fact, whichever
-- attempt wrote it, even one rescued since. Steps of jobs that do not exist here are
-- ignored, and so are those of attempts up to the job's steps_reset_attempt (an operator
-- forgot them: jobs retry --reset-steps), and those of another job than the one that ran the
-- step (its uid: the id may have gone to another job since the database went back in time).
-- The jobs' rows are locked (KEY SHARE, as the foreign key would) first, so a job deleted
-- meanwhile is skipped instead of failing the batch. With mark_outbox (a batch of steps
-- alone, this statement its transaction), the outbox's mark advances (shardworker.outbox_mark).
-- Parameters come in binary; results as bytea holding UTF-8 JSON text.
WITH s AS (
    SELECT * FROM unnest(%(job_ids)b::bigint[], %(names)b::text[], %(attempts)b::int[], %(results)b::bytea[],
                         %(recorded_at)b::float8[], %(uids)b::bigint[])
        AS s(job_id, name, attempt, result_utf8, recorded_at, uid)
), live AS (
    SELECT id, steps_reset_attempt, uid FROM shardworker.jobs WHERE id = ANY(%(job_ids)b::bigint[]) FOR KEY SHARE
), marked AS (
    SELECT shardworker.outbox_mark(%(mark_outbox)s::text, %(mark_worker)s::text, %(mark_batch)s::bigint,
                                   convert_from(%(mark_positions)s::bytea, 'UTF8')::jsonb, %(mark_expect)s::bigint, true)
    WHERE %(mark_outbox)s::text IS NOT NULL
)
INSERT INTO shardworker.job_steps (job_id, name, attempt, result, recorded_at, result_bytes)
SELECT s.job_id, s.name, s.attempt, convert_from(s.result_utf8, 'UTF8')::jsonb, to_timestamp(s.recorded_at),
       octet_length(s.result_utf8)
FROM s JOIN live ON live.id = s.job_id AND s.attempt > live.steps_reset_attempt
                AND (s.uid IS NULL OR live.uid IS NULL OR live.uid = s.uid)
WHERE (SELECT count(*) FROM marked) >= 0
ON CONFLICT (job_id, name) DO NOTHING;

-- job_steps_ahead --
-- After job_steps_insert, in its transaction (a statement of its own: one that updated the
-- rows job_steps_insert locks would make it skip them): the jobs whose steps just recorded are
-- of an attempt their row does not show yet (the claim was lost with the database's going back
-- in time) are marked, so their next claim reads the steps whatever its attempt number.
UPDATE shardworker.jobs j SET steps_ahead = true
FROM unnest(%(job_ids)s::bigint[], %(attempts)s::int[], %(uids)s::bigint[]) AS s(job_id, attempt, uid)
WHERE j.id = s.job_id AND s.attempt > j.attempt AND NOT j.steps_ahead
  AND (s.uid IS NULL OR j.uid IS NULL OR j.uid = s.uid);

-- wake_due --
-- Jobs whose sleep is over or whose wait for an event timed out, queued (migration 0025).
SELECT shardworker.wake_due(%(batch)s::int);

-- wake_sent --
-- Waits for an event begun within `within_s` whose event is there, ended (migration 0025).
SELECT shardworker.wake_sent(%(within_s)s::float8, %(batch)s::int);

-- events_prune --
-- Events past their retention (run --event-retention), `limit` at a time by sent_at, under the
-- prune lock (prune_lock, earlier in the transaction).
DELETE FROM shardworker.events WHERE id IN (
    SELECT id FROM shardworker.events WHERE sent_at < now() - make_interval(secs => %(older_than_s)s::float8)
    ORDER BY sent_at LIMIT %(limit)s);

-- event_send --
-- Send an event (shardworker.send_event, migration 0025), in the caller's transaction; how
-- many waiting jobs it woke.
SELECT shardworker.send_event(%(key)s::text, convert_from(%(payload)s::bytea, 'UTF8')::jsonb);

-- job_lock_for_wake --
-- The jobs `jobs wake` names, locked, with their status and what a waiting one waits on.
SELECT id, status, CASE WHEN status = 'waiting' THEN coalesce(wait_kind, 'jobs') END
FROM shardworker.jobs WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id FOR UPDATE;

-- job_wake --
-- Sleeping jobs queued now (their sleep is recorded: the next run passes it).
WITH woken AS (
    UPDATE shardworker.jobs
    SET status = 'queued', run_at = now(), wait_kind = NULL, wait_until = NULL, wait_since = NULL, updated_at = now()
    WHERE id = ANY(%(ids)s::bigint[]) AND status = 'waiting' AND wait_kind = 'sleep'
    RETURNING id
), announced AS (
    SELECT pg_notify('shardworker_jobs', '') FROM woken LIMIT 1
)
SELECT id FROM woken WHERE (SELECT count(*) FROM announced) >= 0;

-- job_progress --
-- How far running jobs got (job.progress, through the outbox): each job's last value of the
-- batch (its records in outbox order), on the attempt that reported it (of the same job: its
-- uid), never over a value its attempt reported later (a batch applied again; times compared
-- within one attempt only: a later attempt may run on a host whose clock is behind).
UPDATE shardworker.jobs j
SET progress = convert_from(p.value, 'UTF8')::jsonb, progress_at = to_timestamp(p.at), progress_attempt = p.attempt
FROM (SELECT DISTINCT ON (id) id, attempt, uid, value, at
      FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(uids)s::bigint[], %(values)s::bytea[], %(at)s::float8[])
          WITH ORDINALITY AS p(id, attempt, uid, value, at, n)
      ORDER BY id, n DESC) p
WHERE j.id = p.id AND j.attempt = p.attempt AND (p.uid IS NULL OR j.uid IS NULL OR j.uid = p.uid)
  AND (j.progress_attempt IS DISTINCT FROM p.attempt OR j.progress_at <= to_timestamp(p.at));

-- job_trace_runs --
-- The run spans of attempts that ended to run again (a retry, a snooze, a wait), as W3C
-- traceparents (shardworker.core.tracing): each job's trace keeps its newest 32, which its
-- later runs link to. In the apply's transaction; a run already kept (a batch applied again
-- after its reply was lost) is not added twice, and writes nothing.
UPDATE shardworker.jobs j
SET trace = jsonb_set(coalesce(j.trace, '{}'), '{runs}', (
        SELECT coalesce(jsonb_agg(r.run ORDER BY r.n), '[]') FROM (
            SELECT e.run, e.n FROM jsonb_array_elements(coalesce(j.trace -> 'runs', '[]') || t.runs)
                                   WITH ORDINALITY AS e(run, n)
            ORDER BY e.n DESC LIMIT 32) r))
FROM (SELECT u.id, jsonb_agg(to_jsonb(u.run) ORDER BY u.ord) AS runs
      FROM unnest(%(ids)s::bigint[], %(runs)s::text[]) WITH ORDINALITY AS u(id, run, ord)
      GROUP BY u.id) t
WHERE j.id = t.id AND NOT coalesce(j.trace -> 'runs', '[]') @> t.runs;

-- events_send_many --
-- The events handlers sent (job.send_event), in the transaction that applies their outcomes,
-- in order; each once by its job and its place among the job's sends (shardworker.send_job_event,
-- migration 0025).
SELECT shardworker.send_job_event(e.job_id, e.idx, e.key, e.payload)
FROM unnest(%(job_ids)s::bigint[], %(idxs)s::int[], %(keys)s::text[], %(payloads)s::jsonb[])
    WITH ORDINALITY AS e(job_id, idx, key, payload, n)
ORDER BY e.n;

-- job_waits_begin --
-- After job_apply_outcomes set suspended jobs waiting, in its transaction: what each waits on
-- (shardworker.begin_wait, migration 0025).
SELECT shardworker.begin_wait(w.id, w.attempt, w.wait)
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(waits)s::jsonb[]) AS w(id, attempt, wait);

-- job_classify --
-- For outcomes that matched no running attempt: which attempt's outcome each job last
-- applied (equal to the outcome's attempt means a harmless replay; otherwise stale, or
-- cancelled while that attempt ran when the job is cancelled at that attempt). A job
-- missing from the result does not exist in this database; one of another uid is another job.
SELECT id, applied_attempt, status, attempt, uid FROM shardworker.jobs WHERE id = ANY(%(ids)s::bigint[]);

-- job_release --
-- Give back claimed jobs whose handler never started: the claim is undone, attempt too. Never
-- an attempt that recorded a step (its handler did start, whatever said otherwise): undone, the
-- claim would come back as the same attempt number, which is given no recorded steps.
UPDATE shardworker.jobs j
SET status = 'queued', attempt = j.attempt - 1, locked_by = NULL, updated_at = now()
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS r(id, attempt)
WHERE j.id = r.id AND j.attempt = r.attempt AND j.status = 'running' AND j.locked_by = %(worker_id)s
  AND NOT EXISTS (SELECT FROM shardworker.job_steps s WHERE s.job_id = j.id AND s.attempt = j.attempt);

-- job_release_claim --
-- Give back the jobs of a claim whose reply never arrived: no child ever saw them (nor, so,
-- recorded a step; checked as job_release does all the same).
UPDATE shardworker.jobs j
SET status = 'queued', attempt = attempt - 1, locked_by = NULL, updated_at = now()
WHERE claim_token = %(claim_token)s AND status = 'running' AND locked_by = %(worker_id)s
  AND NOT EXISTS (SELECT FROM shardworker.job_steps s WHERE s.job_id = j.id AND s.attempt = j.attempt);

-- job_release_unstarted --
-- At startup, after the outbox is drained: this worker's running jobs whose handler never
-- started (no child's progress slot names them) are given back as job_release does,
-- uncharged; not one that recorded a step (progress files zeroed on disk say nothing started):
-- it stays running, for the orphans' requeue to charge, and its retry gets its steps.
UPDATE shardworker.jobs j
SET status = 'queued', attempt = attempt - 1, locked_by = NULL, updated_at = now()
WHERE status = 'running' AND locked_by = %(worker_id)s AND id <> ALL(%(started)s::bigint[])
  AND NOT EXISTS (SELECT FROM shardworker.job_steps s WHERE s.job_id = j.id AND s.attempt = j.attempt)
RETURNING id;

-- job_requeue_orphans --
-- At startup, after the outbox is drained: this worker's running jobs have no outcome, so
-- their handlers never finished. Retry them (the lost run counts as an attempt, in errors too).
UPDATE shardworker.jobs
SET status = CASE WHEN attempt - snoozes < max_attempts THEN 'queued' ELSE 'failed' END,
    last_error = %(error)s, locked_by = NULL, updated_at = now(),
    errors = shardworker.errors_with(errors, attempt, %(error)s, NULL, now(), %(errors_kept)s),
    finished_at = CASE WHEN attempt - snoozes < max_attempts THEN NULL ELSE now() END
WHERE status = 'running' AND locked_by = %(worker_id)s
RETURNING id;

-- job_insert --
-- Enqueue one job; no row when a live job already holds the dedupe key. The payload is typed
-- text first, so payload_bytes is the size of the JSON text as sent. A plain VALUES row: on a
-- caller's connection nothing is server-prepared (PgBouncer), so each enqueue is planned, and
-- this plans in a third less time than job_insert_windowed. No NOTIFY here: the caller sends
-- notify_queue next, in its own statement (see shardworker.store.enqueue).
INSERT INTO shardworker.jobs (kind, queue, payload, payload_bytes, priority, max_attempts, run_at, dedupe_key, key,
                              tags, trace)
VALUES (%(kind)s, %(queue)s, %(payload)s::text::jsonb, octet_length(%(payload)s::text), %(priority)s,
        %(max_attempts)s, coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay_s)s),
        %(dedupe_key)s, %(key)s, %(tags)s::text[], %(trace)s::jsonb)
ON CONFLICT (dedupe_key) WHERE dedupe_key IS NOT NULL AND status IN ('waiting', 'queued', 'running') DO NOTHING
RETURNING id;

-- job_insert_windowed --
-- job_insert with a dedupe window: no row also when a job with the key was enqueued or ended
-- within it (done, failed or cancelled alike).
INSERT INTO shardworker.jobs (kind, queue, payload, payload_bytes, priority, max_attempts, run_at, dedupe_key, key,
                              tags, trace)
SELECT %(kind)s, %(queue)s, %(payload)s::text::jsonb, octet_length(%(payload)s::text), %(priority)s,
       %(max_attempts)s, coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay_s)s),
       %(dedupe_key)s, %(key)s, %(tags)s::text[], %(trace)s::jsonb
WHERE %(dedupe_window_s)s::float8 IS NULL OR NOT EXISTS (
    SELECT FROM shardworker.jobs d
    WHERE d.dedupe_key = %(dedupe_key)s
      AND (d.status IN ('waiting', 'queued', 'running')
           OR d.created_at >= now() - make_interval(secs => %(dedupe_window_s)s::float8)
           OR d.finished_at >= now() - make_interval(secs => %(dedupe_window_s)s::float8)))
ON CONFLICT (dedupe_key) WHERE dedupe_key IS NOT NULL AND status IN ('waiting', 'queued', 'running') DO NOTHING
RETURNING id;

-- job_insert_debounced --
-- Enqueue one job to run `debounce_s` after the last of its enqueues: while a job holding the
-- dedupe key is still queued and has never run, this replaces its payload and pushes its
-- run_at to now + debounce_s (+ delay; never earlier than it was, as an operator may have
-- set it later), and returns its id; with none live, inserts the job
-- so. A holder that runs, waits, or ran before (a retry, a snooze, a rescued job waiting its
-- grace: its steps or a late outcome belong to the payload it ran with) stays as it is, and
-- no row comes back (a duplicate). The holder's kind, queue and priority stay.
INSERT INTO shardworker.jobs AS j (kind, queue, payload, payload_bytes, priority, max_attempts, run_at, dedupe_key,
                                   key, tags, trace)
VALUES (%(kind)s, %(queue)s, %(payload)s::text::jsonb, octet_length(%(payload)s::text), %(priority)s,
        %(max_attempts)s,
        coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay_s)s + %(debounce_s)s::float8),
        %(dedupe_key)s, %(key)s, %(tags)s::text[], %(trace)s::jsonb)
ON CONFLICT (dedupe_key) WHERE dedupe_key IS NOT NULL AND status IN ('waiting', 'queued', 'running')
DO UPDATE SET payload = excluded.payload, payload_bytes = excluded.payload_bytes, tags = excluded.tags,
              trace = excluded.trace,  -- the run continues the last enqueue's trace, as it takes its payload
              run_at = greatest(j.run_at, excluded.run_at), updated_at = now()  -- never earlier than set
WHERE j.status = 'queued' AND j.attempt = 0
RETURNING id;

-- job_stage_create --
-- A session-local staging table for bulk enqueue through COPY; ord is each row's position.
CREATE TEMP TABLE shardworker_stage (
    kind text, queue text, payload text, priority int, max_attempts int,
    run_at timestamptz, dedupe_key text, key text, tags text[], trace text, ord int
) ON COMMIT DROP;

-- job_stage_copy --
-- COPY rows into the staging table.
COPY shardworker_stage (kind, queue, payload, priority, max_attempts, run_at, dedupe_key, key, tags, trace, ord) FROM STDIN;

-- job_stage_insert --
-- Move staged rows into the jobs table in their order (ord), skipping live dedupe-key
-- duplicates. Returns (id, dedupe_key) of the rows inserted, by id: the ids were drawn in
-- the rows' order, so shardworker.store.enqueue.inserted_ids gives each row its id, or None.
WITH ins AS (
    INSERT INTO shardworker.jobs (kind, queue, payload, payload_bytes, priority, max_attempts, run_at, dedupe_key,
                                  key, tags, trace)
    SELECT kind, queue, payload::jsonb, octet_length(payload), priority, max_attempts, coalesce(run_at, now()),
           dedupe_key, key, tags, trace::jsonb
    FROM shardworker_stage ORDER BY ord
    ON CONFLICT (dedupe_key) WHERE dedupe_key IS NOT NULL AND status IN ('waiting', 'queued', 'running') DO NOTHING
    RETURNING id, dedupe_key
)
SELECT id, dedupe_key FROM ins ORDER BY id;

-- job_stage_drop --
-- Drop the staging table at once, so another bulk enqueue in the same transaction can create it.
DROP TABLE shardworker_stage;

-- notify_jobs --
-- Wake listening workers.
SELECT pg_notify('shardworker_jobs', '');

-- notify_queue --
-- Wake listening workers for a job of one queue (the payload names it).
SELECT pg_notify('shardworker_jobs', %(queue)s);

-- listen_jobs --
-- Subscribe to enqueue notifications, and to the cancels of running jobs (job_cancel).
LISTEN shardworker_jobs;
LISTEN shardworker_cancel;

-- backend_pid --
-- The server backend this statement runs on (a pooler's connection reports another pid at startup).
SELECT pg_backend_pid();

-- notify_probe --
-- Does a NOTIFY reach this worker's LISTEN? Workers ignore a cancel whose payload holds no ids.
SELECT pg_notify('shardworker_cancel', %(token)s);

-- other_schemas --
-- The other schemas of this database that hold shardworker's tables (its ledger, its instance
-- row, its jobs): named when a command finds nothing, in case it was given no --schema, or the
-- wrong one. (No schema's name is written here: this text is the same in every schema.)
SELECT n.nspname FROM pg_namespace n
WHERE n.nspname <> %(schema)s
  AND to_regclass(quote_ident(n.nspname) || '.migrations') IS NOT NULL
  AND to_regclass(quote_ident(n.nspname) || '.instance') IS NOT NULL
  AND to_regclass(quote_ident(n.nspname) || '.jobs') IS NOT NULL
ORDER BY 1
LIMIT 10;

-- job_stats --
-- Job counts by queue and status.
SELECT queue, status, count(*) FROM shardworker.jobs GROUP BY queue, status ORDER BY queue, status;

-- kinds_unserved --
-- Queued jobs whose kind no live worker serves in their queue (shardworker.serving_workers):
-- a typo in a kind, a worker not deployed yet, or one gone. also_kinds in also_queues (NULL:
-- every queue) count as served: the asking worker's own, whether or not its beat landed yet.
-- By queue and kind, most jobs first, the first `limit`: how many, and the oldest run_at
-- (when the longest waiting of them fell due; later than now only when all are scheduled).
-- Grouped by the bounded names the queued rows' partial index holds (as queue_backlog).
WITH queued AS (
    SELECT left(queue, 255) AS queue, left(kind, 255) AS kind, count(*) AS n, min(run_at) AS oldest
    FROM shardworker.jobs WHERE status = 'queued'
    GROUP BY 1, 2
)
SELECT q.queue, q.kind, q.n, q.oldest, extract(epoch FROM now() - q.oldest)::float8
FROM queued q
WHERE NOT EXISTS (SELECT 1 FROM shardworker.serving_workers w
                  WHERE q.kind = ANY(w.kinds) AND (w.queues IS NULL OR q.queue = ANY(w.queues)))
  AND NOT (q.kind = ANY(%(also_kinds)s::text[])
           AND (%(also_queues)s::text[] IS NULL OR q.queue = ANY(%(also_queues)s::text[])))
ORDER BY q.n DESC, q.queue, q.kind
LIMIT %(limit)s;

-- kinds_unserved_of --
-- Of these (queue, kind) pairs, those no live worker serves (shardworker.serving_workers):
-- what `enqueue --strict` refuses.
SELECT DISTINCT p.queue, p.kind FROM unnest(%(queues)s::text[], %(kinds)s::text[]) AS p(queue, kind)
WHERE NOT EXISTS (SELECT 1 FROM shardworker.serving_workers w
                  WHERE p.kind = ANY(w.kinds) AND (w.queues IS NULL OR p.queue = ANY(w.queues)))
ORDER BY 1, 2;

-- job_count_active --
-- What --exit-when-idle waits on: jobs due now, jobs already attempted (a retry, a snooze,
-- a rescued job) that fall due within retry_horizon_s, and so do sleeps and waits for an event
-- whose time (the wake, the timeout) comes within it; and jobs running for this worker.
-- Jobs of a paused queue wait for an operator, not for this worker: they do not count.
SELECT
  (SELECT count(*) FROM shardworker.jobs
    WHERE status = 'queued' AND kind = ANY(%(kinds)s::text[])
      AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
      AND queue <> ALL(ARRAY(SELECT name FROM shardworker.queues WHERE paused))
      AND (run_at <= now()
           OR (attempt > 0 AND run_at <= now() + make_interval(secs => %(retry_horizon_s)s::float8)))) +
  (SELECT count(*) FROM shardworker.jobs
    WHERE status = 'waiting' AND wait_until <= now() + make_interval(secs => %(retry_horizon_s)s::float8)
      AND kind = ANY(%(kinds)s::text[]) AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
      AND queue <> ALL(ARRAY(SELECT name FROM shardworker.queues WHERE paused))) +
  (SELECT count(*) FROM shardworker.jobs WHERE status = 'running' AND locked_by = %(worker_id)s);

-- worker_heartbeat --
-- Record that this worker is alive, with its load (NULL: not known): jobs it holds, outcomes
-- not yet applied, and its flow report ([[queue, kind, prefetched, running], ...], JSON text);
-- and what it serves: its kinds, its queues (NULL: every queue), its rescue window and the
-- silence after which its slots are released (NULL kinds: nothing, as for a drain). They ride in the row version every beat writes anyway, so
-- a row a rescue removed and a beat inserted again says them at once.
-- A new process under the same worker id starts a new started_at. Unless take_over (a
-- process's first beat), a row another (hostname, pid) wrote meanwhile is left alone: that is
-- a second live worker under this id. Returns whether the row was written, who holds it,
-- whether the beat inserted it (xmax 0: no row was updated): a row a rescue had removed, or
-- one the database lost by going back in time; whether a rescue removed the row this process
-- had (started_at: a tombstone in worker_rescues says so); the row's started_at now; and which
-- server it reached (as server_identity).
WITH beat AS (
    INSERT INTO shardworker.workers AS w (worker_id, hostname, pid, heartbeat_at, jobs_running, outbox_pending, flow,
                                          kinds, queues, rescue_after_s, slots_after_s, server)
    VALUES (%(worker_id)s, %(hostname)s, %(pid)s, now(), %(running)s, %(pending)s, %(flow)s::text::jsonb,
            %(kinds)s::text[], %(queues)s::text[], %(rescue_after_s)s::float8, %(slots_after_s)s::float8,
            shardworker.server_identity())
    ON CONFLICT (worker_id) DO UPDATE
    SET hostname = excluded.hostname, pid = excluded.pid, heartbeat_at = now(), server = excluded.server,
        started_at = CASE WHEN (w.hostname, w.pid) IS DISTINCT FROM (excluded.hostname, excluded.pid)
                          THEN now() ELSE w.started_at END,
        jobs_running = excluded.jobs_running, outbox_pending = excluded.outbox_pending, flow = excluded.flow,
        kinds = excluded.kinds, queues = excluded.queues, rescue_after_s = excluded.rescue_after_s,
        slots_after_s = excluded.slots_after_s
    WHERE %(take_over)s OR (w.hostname, w.pid) = (excluded.hostname, excluded.pid)
    RETURNING xmax = 0 AS inserted, started_at
)
SELECT EXISTS (SELECT 1 FROM beat), w.hostname, w.pid, coalesce((SELECT inserted FROM beat), false),
       EXISTS (SELECT 1 FROM shardworker.worker_rescues r
               WHERE r.worker_id = %(worker_id)s AND r.started_at = %(started_at)s::timestamptz),
       coalesce((SELECT started_at FROM beat), w.started_at), shardworker.server_identity()
FROM (SELECT 1) AS one LEFT JOIN shardworker.workers w ON w.worker_id = %(worker_id)s;

-- worker_get --
-- The heartbeat row of one worker id: who wrote it last, and when.
SELECT hostname, pid, heartbeat_at FROM shardworker.workers WHERE worker_id = %(worker_id)s;

-- worker_list --
-- Every worker row, with its silence as the database's clock measures it, the silence after
-- which its slots are released, and the slots its running jobs hold: of each kind and queue
-- limited across workers, and of each key under a key_concurrency, how many ({"kind:NAME": n,
-- "queue:NAME": n, "key:KEY": n}).
SELECT w.worker_id, w.hostname, w.pid, w.started_at, w.heartbeat_at, w.jobs_running, w.outbox_pending,
       extract(epoch FROM now() - w.heartbeat_at)::float8 AS silent_s, w.slots_after_s,
       (SELECT coalesce(jsonb_object_agg(h.slot, h.n), '{}') FROM (
            SELECT 'kind:' || j.kind AS slot, count(*) AS n FROM shardworker.jobs j
            JOIN shardworker.kinds k ON k.name = j.kind AND k.global_concurrency IS NOT NULL
            WHERE j.status = 'running' AND j.locked_by = w.worker_id GROUP BY j.kind
            UNION ALL
            SELECT 'queue:' || j.queue, count(*) FROM shardworker.jobs j
            JOIN shardworker.queues q ON q.name = j.queue AND q.concurrency IS NOT NULL
            WHERE j.status = 'running' AND j.locked_by = w.worker_id GROUP BY j.queue
            UNION ALL
            SELECT 'key:' || j.key, count(*) FROM shardworker.jobs j
            WHERE j.status = 'running' AND j.locked_by = w.worker_id AND j.key IS NOT NULL
              AND (EXISTS (SELECT FROM shardworker.kinds k WHERE k.name = j.kind AND k.key_concurrency IS NOT NULL)
                   OR EXISTS (SELECT FROM shardworker.queues q WHERE q.name = j.queue AND q.key_concurrency IS NOT NULL))
            GROUP BY j.key) h) AS slots
FROM shardworker.workers w ORDER BY w.hostname, w.worker_id;

-- worker_forget --
-- Remove this worker's heartbeat row at clean shutdown, unless jobs still run under its
-- id (a give-back failed): then the row stays, goes silent, and the rescuer finds them.
-- Only the row this process wrote: another live worker's under the same id stays.
DELETE FROM shardworker.workers
WHERE worker_id = %(worker_id)s AND hostname = %(hostname)s AND pid = %(pid)s
  AND NOT EXISTS (SELECT 1 FROM shardworker.jobs WHERE status = 'running' AND locked_by = %(worker_id)s);

-- worker_release --
-- A drain that ends: its row goes as worker_forget's does, or, while jobs still run under the
-- id (for the rescuer to find), stays naming no process (pid 0), so the next start under this
-- id on this host takes it over at once. Only the row this process wrote.
WITH gone AS (
    DELETE FROM shardworker.workers
    WHERE worker_id = %(worker_id)s AND hostname = %(hostname)s AND pid = %(pid)s
      AND NOT EXISTS (SELECT 1 FROM shardworker.jobs WHERE status = 'running' AND locked_by = %(worker_id)s)
    RETURNING 1
)
UPDATE shardworker.workers SET pid = 0
WHERE worker_id = %(worker_id)s AND hostname = %(hostname)s AND pid = %(pid)s AND NOT EXISTS (SELECT 1 FROM gone);

-- worker_heartbeats --
-- Every worker's last heartbeat, and the silence it says its peers must watch before they
-- rescue it (its --rescue-after; NULL for a drain's row) and before its running jobs stop
-- counting toward limits across workers (its --release-slots-after; NULL: never released).
SELECT worker_id, heartbeat_at, rescue_after_s, slots_after_s FROM shardworker.workers;

-- rescue_workers --
-- Requeue the running jobs of workers the rescuer watched stay silent, each only if its
-- heartbeat is still the one the rescuer watched (a worker that beat meanwhile is alive).
-- The lost run counts as a failed attempt; the job remembers it (rescued_attempt) and waits
-- a grace period before it may be claimed again, so that attempt's outcome, if the worker
-- computed one, can still land. Their heartbeat rows go too; a worker that comes back
-- re-registers. Every live worker watches and may run this at once: the DELETE of a row
-- succeeds for one of them (the others wait for its lock, then find the row gone), and only
-- the jobs of rows it deleted are requeued. Each rescue leaves a tombstone of the process it
-- rescued (worker_rescues), which tells that process's heartbeat its row went by a rescue (a
-- week's are kept). Returns the workers removed and the jobs requeued.
WITH gone AS (
    DELETE FROM shardworker.workers w
    USING unnest(%(worker_ids)s::text[], %(heartbeats)s::timestamptz[]) AS s(worker_id, heartbeat_at)
    WHERE w.worker_id = s.worker_id AND w.heartbeat_at = s.heartbeat_at
    RETURNING w.worker_id, w.started_at
), buried AS (
    INSERT INTO shardworker.worker_rescues (worker_id, started_at)
    SELECT worker_id, started_at FROM gone ON CONFLICT DO NOTHING
    RETURNING 1
), forgotten AS (
    DELETE FROM shardworker.worker_rescues WHERE rescued_at < now() - interval '7 days' RETURNING 1
), requeued AS (
    UPDATE shardworker.jobs
    SET status = CASE WHEN attempt - snoozes < max_attempts THEN 'queued' ELSE 'failed' END,
        last_error = 'rescued: worker ' || locked_by || ' stopped heartbeating',
        errors = shardworker.errors_with(errors, attempt, 'rescued: worker ' || locked_by || ' stopped heartbeating',
                                         NULL, now(), %(errors_kept)s),
        rescued_attempt = attempt, run_at = now() + make_interval(secs => %(grace_s)s),
        locked_by = NULL, updated_at = now(),
        finished_at = CASE WHEN attempt - snoozes < max_attempts THEN NULL ELSE now() END
    WHERE status = 'running' AND locked_by IN (SELECT worker_id FROM gone)
    RETURNING id
)
SELECT ARRAY(SELECT worker_id FROM gone ORDER BY worker_id), ARRAY(SELECT id FROM requeued ORDER BY id)
WHERE (SELECT count(*) FROM buried) + (SELECT count(*) FROM forgotten) >= 0;

-- db_identity --
-- What an outbox directory is bound to: this database's instance id and name.
SELECT id::text, current_database() FROM shardworker.instance;

-- job_requeue_lost --
-- This worker's running jobs whose outcome is gone (quarantined with a corrupt outbox
-- segment), i.e. every one no child still holds and no outbox record still carries:
-- retried at once, the lost run counted as an attempt (in errors too).
UPDATE shardworker.jobs
SET status = CASE WHEN attempt - snoozes < max_attempts THEN 'queued' ELSE 'failed' END,
    last_error = %(error)s, locked_by = NULL, updated_at = now(),
    errors = shardworker.errors_with(errors, attempt, %(error)s, NULL, now(), %(errors_kept)s),
    finished_at = CASE WHEN attempt - snoozes < max_attempts THEN NULL ELSE now() END
WHERE status = 'running' AND locked_by = %(worker_id)s AND NOT (id = ANY(%(keep_ids)s::bigint[]))
RETURNING id;

-- job_list --
-- Jobs for `shardworker jobs list`, newest first, with optional filters.
SELECT id, kind, queue, status, attempt, max_attempts, priority, payload, result, last_error,
       created_at, run_at, attempted_at, finished_at, locked_by, snoozes, key, progress,
       CASE WHEN status = 'waiting' THEN coalesce(wait_kind, 'jobs') END, wait_key, wait_until,
       coalesce(tags, '{}'::text[])
FROM shardworker.jobs
WHERE (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(key)s::text IS NULL OR key = %(key)s::text)
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)
  AND (%(tags)s::text[] IS NULL OR tags @> %(tags)s::text[])
  AND (%(error)s::text IS NULL OR strpos(lower(last_error), lower(%(error)s::text)) > 0)
ORDER BY id DESC
LIMIT %(limit)s;

-- job_ids_matching --
-- The jobs a bulk `jobs retry|cancel|delete` picks (the filters of job_list) whose status the
-- action allows, at most `limit`. A delete leaves out the jobs that live jobs wait on (as
-- retention does): deleting one would cancel them. The change locks them (job_queries adds
-- FOR UPDATE OF j SKIP LOCKED: a job a claim holds is left out); a dry run counts them,
-- locking nothing.
SELECT id FROM shardworker.jobs j
WHERE status = ANY(%(allowed)s::text[])
  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(key)s::text IS NULL OR key = %(key)s::text)
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)
  AND (%(tags)s::text[] IS NULL OR tags @> %(tags)s::text[])
  AND (%(error)s::text IS NULL OR strpos(lower(last_error), lower(%(error)s::text)) > 0)
  AND (%(action)s::text <> 'delete' OR NOT EXISTS (
      SELECT FROM shardworker.job_dependencies d JOIN shardworker.jobs w ON w.id = d.job_id
      WHERE d.depends_on = j.id AND w.status IN ('waiting', 'queued', 'running')))
ORDER BY id
LIMIT %(limit)s

-- job_id_mark --
-- The last job id drawn so far (0: none), by any session, committed or not: a job enqueued
-- later has a greater id (shardworker.testing.record_enqueued).
SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('shardworker.jobs', 'id')::regclass), 0);

-- job_list_after --
-- Jobs with an id above `after`, in id order: those enqueued since job_id_mark said it.
SELECT id, kind, queue, status, attempt, max_attempts, priority, payload, result, last_error,
       created_at, run_at, attempted_at, finished_at, locked_by, snoozes, key, progress,
       CASE WHEN status = 'waiting' THEN coalesce(wait_kind, 'jobs') END, wait_key, wait_until,
       coalesce(tags, '{}'::text[])
FROM shardworker.jobs WHERE id > %(after)s ORDER BY id;

-- job_get --
-- One job, whole.
SELECT id, kind, queue, status, attempt, max_attempts, priority, payload, result, last_error,
       created_at, run_at, attempted_at, finished_at, locked_by, snoozes, key, progress,
       CASE WHEN status = 'waiting' THEN coalesce(wait_kind, 'jobs') END, wait_key, wait_until,
       coalesce(tags, '{}'::text[])
FROM shardworker.jobs WHERE id = %(id)s;

-- job_errors --
-- A job's errors history (its last failed attempts, oldest first); no row: no such job.
SELECT errors FROM shardworker.jobs WHERE id = %(id)s;

-- job_steps_list --
-- A job's recorded steps, in recorded order (then name), the first `limit` of them (NULL:
-- all), each with the size of its result's JSON text, and how many the job holds in all.
-- Sizes are computed for the rows returned only (the LIMIT is inside): a result may be 64 MiB.
SELECT name, attempt, recorded_at, octet_length(result::text), total
FROM (SELECT name, attempt, recorded_at, result, count(*) OVER () AS total
      FROM shardworker.job_steps WHERE job_id = %(id)s
      ORDER BY recorded_at, name LIMIT %(limit)s) listed
ORDER BY recorded_at, name;

-- job_lock_for_change --
-- Lock the jobs an operator command changes, so a worker cannot claim or finish them
-- between the check and the change.
SELECT id, status FROM shardworker.jobs WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id FOR UPDATE;

-- job_retry --
-- Queue failed or cancelled jobs again, due now, with at least one attempt left. A rescued
-- attempt's late outcome no longer applies (it would be stale). The jobs' recorded steps stay
-- unless reset_steps: then the steps of the jobs queued again are deleted, and records of
-- their attempts so far that still wait in an outbox are ignored when they land
-- (steps_reset_attempt), so their code runs again. Returns the ids queued again.
-- A job that waited on others goes back to waiting on those not done now (queued when all
-- are; job_dependencies_lock holds them first); not one whose dependency was deleted.
WITH deps AS (
    SELECT d.job_id, count(*) FILTER (WHERE t.status IS DISTINCT FROM 'done') AS pending,
           count(*) FILTER (WHERE t.id IS NULL) AS deleted,
           coalesce(sum(octet_length(t.result::text)) FILTER (WHERE t.status = 'done'), 0) AS bytes
    FROM shardworker.job_dependencies d LEFT JOIN shardworker.jobs t ON t.id = d.depends_on
    WHERE d.job_id = ANY(%(ids)s::bigint[])
    GROUP BY d.job_id
), retried AS (
    UPDATE shardworker.jobs j
    SET status = CASE WHEN coalesce(deps.pending, 0) > 0 THEN 'waiting' ELSE 'queued' END,
        deps_pending = coalesce(deps.pending, 0), deps_bytes = coalesce(deps.bytes, 0),
        last_error = CASE WHEN deps.job_id IS NOT NULL AND j.status = 'cancelled' THEN NULL ELSE j.last_error END,
        run_at = now(), max_attempts = greatest(max_attempts, attempt - snoozes + 1),
        finished_at = NULL, rescued_attempt = NULL, updated_at = now(),
        wait_kind = NULL, wait_name = NULL, wait_key = NULL, wait_until = NULL, wait_since = NULL,
        steps_reset_attempt = CASE WHEN %(reset_steps)s THEN attempt ELSE steps_reset_attempt END
    FROM unnest(%(ids)s::bigint[]) AS x(id) LEFT JOIN deps ON deps.job_id = x.id
    WHERE j.id = x.id AND j.status IN ('failed', 'cancelled') AND coalesce(deps.deleted, 0) = 0
    RETURNING j.id
), forgotten AS (
    DELETE FROM shardworker.job_steps WHERE %(reset_steps)s AND job_id IN (SELECT id FROM retried)
)
SELECT id FROM retried;

-- job_dependencies_lock --
-- Lock the jobs these wait on (FOR SHARE, in id order) before deciding from their status:
-- an outcome applied to one meanwhile waits for this transaction's commit.
SELECT id FROM shardworker.jobs
WHERE id IN (SELECT depends_on FROM shardworker.job_dependencies WHERE job_id = ANY(%(ids)s::bigint[]))
ORDER BY id FOR SHARE;

-- job_failed_ids --
-- Failed jobs, optionally of one kind and queue, locked for a bulk retry. The left(..., 255)
-- terms match jobs_failed_bounded_idx (migration 0007); the whole names then decide.
SELECT id FROM shardworker.jobs
WHERE status = 'failed'
  AND (%(kind)s::text IS NULL OR (left(kind, 255) = left(%(kind)s::text, 255) AND kind = %(kind)s::text))
  AND (%(queue)s::text IS NULL OR (left(queue, 255) = left(%(queue)s::text, 255) AND queue = %(queue)s::text))
ORDER BY id FOR UPDATE;

-- job_cancel --
-- Cancel queued, waiting or running jobs: they will never be claimed again (job_dependents_cancel
-- then cancels the jobs waiting on them). A running one's attempt then matches no row that
-- job_apply_outcomes applies to, so whatever outcome it ends with is fenced out; its worker is
-- told on shardworker_cancel (id:attempt, comma-separated) to stop the handler of that
-- attempt: not of a retry it may have claimed before it heard (releases before 2026-12-07 sent
-- the ids alone; they skip these entries and find the cancel by their poll). Announced as
-- job_apply_outcomes does.
WITH target AS (
    SELECT id, status AS was FROM shardworker.jobs
    WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('queued', 'waiting', 'running')
    FOR UPDATE
), cancelled AS (
    UPDATE shardworker.jobs j
    SET status = 'cancelled', finished_at = now(), rescued_attempt = NULL, locked_by = NULL, updated_at = now(),
        wait_kind = NULL, wait_key = NULL, wait_until = NULL, wait_since = NULL,
        last_error = 'cancelled by an operator'
    FROM target t WHERE j.id = t.id
    RETURNING j.id, j.attempt, t.was
), announced AS (
    SELECT shardworker.notify_finished(array_agg(id)) AS sent FROM cancelled
), stopped AS (
    SELECT pg_notify('shardworker_cancel', string_agg(id::text || ':' || attempt::text, ','))
    FROM (SELECT id, attempt, (row_number() OVER ()) / 300 AS chunk FROM cancelled WHERE was = 'running') c
    GROUP BY chunk
)
SELECT id FROM cancelled WHERE (SELECT count(*) FROM announced) + (SELECT count(*) FROM stopped) >= 0;

-- job_update --
-- Change a queued job (due now or scheduled later): its run_at (or now + delay_s), priority or
-- queue, those given (NULL: kept). Returns its row when changed, nothing when the job is not
-- queued, or when a time is given for a rescued job still waiting its grace (its dead
-- worker's late outcome may land meanwhile): job_get says why. Workers are woken by
-- notify_queue after it.
UPDATE shardworker.jobs
SET run_at = CASE WHEN %(delay_s)s::float8 IS NOT NULL THEN now() + make_interval(secs => %(delay_s)s::float8)
                  ELSE coalesce(%(run_at)s::timestamptz, run_at) END,
    priority = coalesce(%(priority)s::int, priority), queue = coalesce(%(queue)s::text, queue), updated_at = now()
WHERE id = %(id)s AND status = 'queued'
  AND (rescued_attempt IS NULL OR (%(delay_s)s::float8 IS NULL AND %(run_at)s::timestamptz IS NULL))
RETURNING id, kind, queue, status, attempt, max_attempts, priority, payload, result, last_error,
          created_at, run_at, attempted_at, finished_at, locked_by, snoozes, key, progress, NULL::text,
          NULL::text, NULL::timestamptz, coalesce(tags, '{}'::text[]);

-- job_cancelled_among --
-- Which of the attempts a worker holds (ids and attempts, pairwise) an operator cancelled: the
-- job is cancelled at that attempt, or has moved past it (cancelled, retried and claimed
-- again). The poll behind shardworker_cancel, for a notification missed while the worker's
-- connection was away.
SELECT h.id, h.attempt
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS h(id, attempt)
JOIN shardworker.jobs j ON j.id = h.id
WHERE (j.status = 'cancelled' AND j.attempt = h.attempt) OR j.attempt > h.attempt;

-- queue_delete --
-- Delete every job of one queue (the outage demo's fresh start, on its own database).
DELETE FROM shardworker.jobs WHERE queue = %(queue)s;

-- queue_recorded_steps --
-- Each recorded step of one queue's jobs, with the attempt that recorded it (the steps demo's count).
SELECT s.job_id, s.name, s.attempt FROM shardworker.job_steps s JOIN shardworker.jobs j ON j.id = s.job_id
WHERE j.queue = %(queue)s;

-- job_delete --
-- Delete jobs that are not running; announced, so a wait_for on one of them ends.
WITH deleted AS (
    DELETE FROM shardworker.jobs WHERE id = ANY(%(ids)s::bigint[]) AND status <> 'running'
    RETURNING id
), announced AS (
    SELECT shardworker.notify_finished(array_agg(id)) AS sent FROM deleted
)
SELECT id FROM deleted WHERE (SELECT count(*) FROM announced) >= 0;

-- listen_finished --
-- Subscribe to the ends of jobs (shardworker.jobs.wait_for).
LISTEN shardworker_finished;

-- unlisten_finished --
-- Undo listen_finished on a connection that is the caller's.
UNLISTEN shardworker_finished;

-- prune_lock --
-- One pruner at a time across workers and hosts, for one batch: a transaction advisory lock.
SELECT pg_try_advisory_xact_lock(hashtext('shardworker.prune'));

-- prune_batch --
-- Delete up to `limit` finished jobs of `statuses` (some of done, failed, cancelled) that
-- ended more than `older_than_s` seconds ago, oldest first, through jobs_finished_idx; rows
-- locked by someone else are left for later, and so is a job that a waiting, queued or
-- running job depends on (its result is that job's job.dependencies).
WITH doomed AS (
    SELECT id FROM shardworker.jobs j
    WHERE status IN ('done', 'failed', 'cancelled') AND status = ANY(%(statuses)s::text[])
      AND finished_at < now() - make_interval(secs => %(older_than_s)s)
      AND NOT (has_dependents AND EXISTS (
          SELECT 1 FROM shardworker.job_dependencies d JOIN shardworker.jobs w ON w.id = d.job_id
          WHERE d.depends_on = j.id AND w.status IN ('waiting', 'queued', 'running')))
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM shardworker.jobs WHERE id = ANY(ARRAY(SELECT id FROM doomed));

-- job_table_size --
-- The planner's estimate of the jobs table's rows (no scan).
SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = 'shardworker.jobs'::regclass;

-- job_stats_unfinished --
-- Exact counts of every status but done, each through its partial index.
SELECT queue, 'waiting', count(*) FROM shardworker.jobs WHERE status = 'waiting' GROUP BY queue
UNION ALL
SELECT queue, 'queued', count(*) FROM shardworker.jobs WHERE status = 'queued' GROUP BY queue
UNION ALL
SELECT queue, 'running', count(*) FROM shardworker.jobs WHERE status = 'running' GROUP BY queue
UNION ALL
SELECT queue, 'failed', count(*) FROM shardworker.jobs WHERE status = 'failed' GROUP BY queue
UNION ALL
SELECT queue, 'cancelled', count(*) FROM shardworker.jobs WHERE status = 'cancelled' GROUP BY queue;

-- job_queue_shares --
-- The planner's statistics: the share of rows in each common queue (from ANALYZE).
SELECT s.queue, s.share
FROM pg_stats, unnest(most_common_vals::text::text[], most_common_freqs) AS s(queue, share)
WHERE schemaname = 'shardworker' AND tablename = 'jobs' AND attname = 'queue';

-- periodic_claim --
-- Take a schedule's row, creating it on first sight, and lock it until the transaction
-- ends: the worker holding it decides which ticks are due, enqueues them and moves
-- last_tick, so every tick is enqueued by exactly one worker. Returns the database's now.
INSERT INTO shardworker.periodic AS p (name, schedule) VALUES (%(name)s, %(schedule)s)
ON CONFLICT (name) DO UPDATE SET schedule = excluded.schedule
RETURNING p.last_tick, now();

-- periodic_advance --
-- Record the last tick enqueued (in the transaction that enqueued it).
UPDATE shardworker.periodic SET last_tick = %(last_tick)s, updated_at = now() WHERE name = %(name)s;

-- periodic_list --
-- The state of every schedule a worker checked (periodic_advance) within the last within_s.
SELECT name, schedule, last_tick, updated_at FROM shardworker.periodic
WHERE updated_at >= now() - make_interval(secs => %(within_s)s)
ORDER BY name;

-- periodic_forget --
-- Forget the schedules no worker has checked for older_than_s: removed from the code (or
-- every worker that declares one down that long; it starts afresh when one comes back).
DELETE FROM shardworker.periodic
WHERE updated_at < now() - make_interval(secs => %(older_than_s)s)
RETURNING name;

-- queue_backlog --
-- The backlog by queue and kind, from queued and running rows only: each status through its
-- partial index (jobs_queued_by_queue_idx, jobs_running_names_idx; grouped by the indexed left(.., 255)
-- names, equal to the names for every row enqueue accepts), never a finished row. available:
-- queued and due; scheduled: queued for later; oldest_s: seconds since the oldest available
-- job fell due. Of the claimed (running) jobs, prefetched is what workers that beat within
-- live_within_s report claimed and not started (never more than are claimed), running the
-- rest. A queue with a row in shardworker.queues and no such jobs gets a row of its own
-- with a NULL kind.
WITH queued AS (
    SELECT left(queue, 255) AS queue, left(kind, 255) AS kind,
           count(*) FILTER (WHERE run_at <= now()) AS available,
           count(*) FILTER (WHERE run_at > now()) AS scheduled,
           min(run_at) FILTER (WHERE run_at <= now()) AS oldest
    FROM shardworker.jobs WHERE status = 'queued'
    GROUP BY left(queue, 255), left(kind, 255)
), claimed AS (
    SELECT left(queue, 255) AS queue, left(kind, 255) AS kind, count(*) AS claimed
    FROM shardworker.jobs WHERE status = 'running'
    GROUP BY left(kind, 255), left(queue, 255)
), reported AS (
    SELECT left(f.item->>0, 255) AS queue, left(f.item->>1, 255) AS kind, sum((f.item->>2)::bigint) AS prefetched
    FROM shardworker.workers w, jsonb_array_elements(w.flow) AS f(item)
    WHERE w.heartbeat_at >= now() - make_interval(secs => %(live_within_s)s) AND jsonb_typeof(w.flow) = 'array'
    GROUP BY 1, 2
), names AS (
    SELECT queue, kind FROM queued UNION SELECT queue, kind FROM claimed
)
SELECT n.queue, n.kind, coalesce(q.available, 0), coalesce(q.scheduled, 0),
       least(coalesce(r.prefetched, 0), coalesce(c.claimed, 0)),
       greatest(coalesce(c.claimed, 0) - coalesce(r.prefetched, 0), 0),
       extract(epoch FROM now() - q.oldest)::float8
FROM names n
LEFT JOIN queued q USING (queue, kind) LEFT JOIN claimed c USING (queue, kind) LEFT JOIN reported r USING (queue, kind)
UNION ALL
SELECT s.name, NULL, 0, 0, 0, 0, NULL FROM shardworker.queues s
WHERE NOT EXISTS (SELECT 1 FROM names n WHERE n.queue = left(s.name, 255))
ORDER BY 1, 2 NULLS FIRST;

-- backlog_report_claim --
-- The backlog report's row, if no other worker holds it and it is older than interval_s:
-- locked until this transaction ends, while this worker computes the next report.
SELECT 1 FROM shardworker.backlog_report
WHERE id = 1 AND computed_at < now() - make_interval(secs => %(interval_s)s)
FOR UPDATE SKIP LOCKED;

-- backlog_report_store --
-- The report just computed (rows: [[queue, kind, available, scheduled, prefetched, running,
-- oldest_available_s], ...]).
UPDATE shardworker.backlog_report SET computed_at = now(), rows = %(rows)s::jsonb WHERE id = 1;

-- backlog_report_read --
-- The last report and its age in seconds.
SELECT extract(epoch FROM now() - computed_at)::float8, rows FROM shardworker.backlog_report WHERE id = 1;

-- key_backlog --
-- `stats --by key`: the keys (tenants) with the most unfinished jobs, most first: queued and
-- due, queued for later, claimed (prefetched or started), and how long the oldest due one has
-- waited. Reads the keys' partial indexes' rows only: jobs without a key cost nothing.
SELECT key, count(*) FILTER (WHERE status = 'queued' AND run_at <= now()),
       count(*) FILTER (WHERE status = 'queued' AND run_at > now()),
       count(*) FILTER (WHERE status = 'running'),
       extract(epoch FROM now() - min(run_at) FILTER (WHERE status = 'queued' AND run_at <= now()))::float8
FROM shardworker.jobs
WHERE key IS NOT NULL AND status IN ('queued', 'running')
GROUP BY key
ORDER BY count(*) DESC, key
LIMIT %(limit)s;

-- limits_in_use --
-- Every limit across workers with what uses it now, for `queues`, `stats`, the dashboard and
-- the metrics: a kind's global_concurrency and a queue's concurrency with their running
-- (claimed) jobs but a released worker's; a key_concurrency with its busiest key's running jobs and how many keys
-- are at it; a rate (N per period_s, as starts a second; NULL use); a paused queue (a limit
-- of 0). Each count walks the running jobs' partial indexes.
WITH released AS (
    -- Workers whose rows are silent past their --release-slots-after: their jobs hold no slot
    -- (as `workers` marks them; peers stop counting them once they watched that silence).
    SELECT worker_id FROM shardworker.workers
    WHERE slots_after_s IS NOT NULL AND heartbeat_at < now() - make_interval(secs => slots_after_s)
), l AS (
    SELECT 'kind' AS scope, name, global_concurrency AS concurrency, key_concurrency, rate_limit, rate_period_s,
           false AS paused
    FROM shardworker.kinds
    UNION ALL
    SELECT 'queue', name, concurrency, key_concurrency, rate_limit, rate_period_s, paused FROM shardworker.queues
)
SELECT l.scope, l.name, CASE l.scope WHEN 'kind' THEN 'global_concurrency' ELSE 'concurrency' END,
       l.concurrency::float8,
       (SELECT count(*) FROM shardworker.jobs r WHERE r.status = 'running'
          AND CASE l.scope WHEN 'kind' THEN left(r.kind, 255) = left(l.name, 255) AND r.kind = l.name
                           ELSE left(r.queue, 255) = left(l.name, 255) AND r.queue = l.name END
          AND NOT EXISTS (SELECT FROM released x WHERE x.worker_id = r.locked_by))::float8, NULL::bigint
FROM l WHERE l.concurrency IS NOT NULL
UNION ALL
SELECT l.scope, l.name, 'key_concurrency', l.key_concurrency::float8, coalesce(max(b.n), 0)::float8,
       count(*) FILTER (WHERE b.n >= l.key_concurrency)
FROM l LEFT JOIN LATERAL (
    SELECT count(*) AS n FROM shardworker.jobs r
    WHERE r.status = 'running' AND r.key IS NOT NULL
      AND CASE l.scope WHEN 'kind' THEN r.kind = l.name ELSE r.queue = l.name END
      AND NOT EXISTS (SELECT FROM released x WHERE x.worker_id = r.locked_by)
    GROUP BY r.key) b ON true
WHERE l.key_concurrency IS NOT NULL GROUP BY l.scope, l.name, l.key_concurrency
UNION ALL
SELECT l.scope, l.name, 'rate', l.rate_limit / l.rate_period_s, NULL, NULL FROM l WHERE l.rate_limit IS NOT NULL
UNION ALL
SELECT l.scope, l.name, 'paused', 0, NULL, NULL FROM l WHERE l.paused
ORDER BY 1, 2, 3;

-- queue_states --
-- Every queue's operator state: paused, and its limits across workers (NULL: none).
SELECT name, paused, concurrency, rate_limit, rate_period_s, key_concurrency, key_weights FROM shardworker.queues ORDER BY name;

-- queue_set_paused --
-- Pause or resume a queue (its row created on first use); its limits stay. Returns its state.
INSERT INTO shardworker.queues AS q (name, paused) VALUES (%(name)s, %(paused)s)
ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, updated_at = now()
RETURNING name, paused, concurrency, rate_limit, rate_period_s, key_concurrency, key_weights;

-- queue_set_limits --
-- Set a queue's limits (its row created on first use): a concurrency, a key concurrency or a
-- rate given is set, one not given (NULL) is kept, and clear removes them all. A rate that
-- changes starts an empty bucket now; the same rate again keeps its tokens. Returns its state.
INSERT INTO shardworker.queues AS q (name, concurrency, rate_limit, rate_period_s, key_concurrency, key_weights)
VALUES (%(name)s, %(concurrency)s, %(rate_limit)s, %(rate_period_s)s, %(key_concurrency)s, %(key_weights)s::jsonb)
ON CONFLICT (name) DO UPDATE
SET concurrency = CASE WHEN %(clear)s::boolean THEN NULL ELSE coalesce(excluded.concurrency, q.concurrency) END,
    key_concurrency = CASE WHEN %(clear)s::boolean THEN NULL
                           ELSE coalesce(excluded.key_concurrency, q.key_concurrency) END,
    key_weights = CASE WHEN %(clear)s::boolean THEN NULL WHEN excluded.key_weights IS NULL THEN q.key_weights
                       ELSE coalesce(q.key_weights, '{}') || excluded.key_weights END,
    rate_limit = CASE WHEN %(clear)s::boolean THEN NULL ELSE coalesce(excluded.rate_limit, q.rate_limit) END,
    rate_period_s = CASE WHEN %(clear)s::boolean THEN NULL ELSE coalesce(excluded.rate_period_s, q.rate_period_s) END,
    rate_tokens = CASE WHEN excluded.rate_limit IS NOT NULL
                            AND (excluded.rate_limit, excluded.rate_period_s) IS DISTINCT FROM (q.rate_limit, q.rate_period_s)
                       THEN 0 ELSE q.rate_tokens END,
    rate_at = CASE WHEN excluded.rate_limit IS NOT NULL
                        AND (excluded.rate_limit, excluded.rate_period_s) IS DISTINCT FROM (q.rate_limit, q.rate_period_s)
                   THEN now() ELSE q.rate_at END,
    updated_at = now()
RETURNING name, paused, concurrency, rate_limit, rate_period_s, key_concurrency, key_weights;

-- doctor_server_state --
-- The server's clock as the statement runs, and whether it accepts writes (a standby, or
-- default_transaction_read_only): settings read, nothing written.
SELECT clock_timestamp(), pg_is_in_recovery(), current_setting('transaction_read_only') = 'on';

-- dashboard_kind_counts --
-- The dashboard's counts by queue and kind that queue_backlog does not give, cheap however
-- big the table: waiting (on dependencies), failed and cancelled counted exactly, each
-- through its partial index, and done only over the last hour through jobs_finished_idx
-- (reported as status 'done_1h').
SELECT queue, kind, 'waiting', count(*) FROM shardworker.jobs WHERE status = 'waiting' GROUP BY queue, kind
UNION ALL
SELECT queue, kind, 'failed', count(*) FROM shardworker.jobs WHERE status = 'failed' GROUP BY queue, kind
UNION ALL
SELECT queue, kind, 'cancelled', count(*) FROM shardworker.jobs WHERE status = 'cancelled' GROUP BY queue, kind
UNION ALL
SELECT queue, kind, 'done_1h', count(*) FROM shardworker.jobs
WHERE status = 'done' AND finished_at >= now() - interval '1 hour'
GROUP BY queue, kind;

-- dashboard_finished_per_minute --
-- Jobs that ended in each of the last 60 minutes (the current one last), done and failed
-- apart: a range scan of jobs_finished_idx over one hour, so the cost follows the hour's
-- throughput, not the table's size. Minutes with none are zeros.
WITH ended AS (
    SELECT date_trunc('minute', finished_at) AS minute,
           count(*) FILTER (WHERE status = 'done') AS done,
           count(*) FILTER (WHERE status = 'failed') AS failed
    FROM shardworker.jobs
    WHERE status IN ('done', 'failed', 'cancelled')
      AND finished_at >= date_trunc('minute', now()) - interval '59 minutes'
    GROUP BY 1
)
SELECT m.minute, coalesce(e.done, 0), coalesce(e.failed, 0)
FROM generate_series(date_trunc('minute', now()) - interval '59 minutes', date_trunc('minute', now()),
                     interval '1 minute') AS m(minute)
LEFT JOIN ended e USING (minute)
ORDER BY m.minute;

-- job_dependencies_missing --
-- Of the jobs an enqueue names in after=, those that do not exist (the enqueue is refused).
SELECT a.id FROM unnest(%(ids)s::bigint[]) AS a(id)
WHERE NOT EXISTS (SELECT 1 FROM shardworker.jobs j WHERE j.id = a.id)
ORDER BY a.id;

-- job_dependent_insert --
-- Insert jobs that may wait on others (follow-ups of a handler, enqueue with after=), in
-- the order given: those with dependencies as waiting (job_dependencies_settle_new decides
-- once their edges exist), the rest as queued. Ids are drawn here, so each row comes back
-- by its position; a job whose dedupe key a live job holds is not inserted, and comes back
-- as that job's id (inserted false): the one inserted by this statement (an earlier row of
-- the same batch, which the lookup in the table cannot see yet), else one already there, or
-- NULL when none is found. A given id (a follow-up
-- inserted again with the id it had, after the database went back in time) is taken unless
-- another job holds it now; a given uid (a follow-up's, from its parent's run) likewise.
WITH f AS (
    SELECT f.*, CASE WHEN f.given_id IS NOT NULL
                          AND NOT EXISTS (SELECT FROM shardworker.jobs j WHERE j.id = f.given_id) THEN f.given_id
                     ELSE nextval(pg_get_serial_sequence('shardworker.jobs', 'id')) END AS id
    FROM unnest(%(kinds)s::text[], %(queues)s::text[], %(payloads)s::text[], %(priorities)s::int[],
                %(max_attempts)s::int[], %(run_ats)s::timestamptz[], %(delays)s::float8[],
                %(dedupe_keys)s::text[], %(deps_total)s::int[], %(given_ids)s::bigint[], %(given_uids)s::bigint[],
                %(reinserted)s::boolean[], %(keys)s::text[], %(tags)s::jsonb[], %(traces)s::text[])
         WITH ORDINALITY AS f(kind, queue, payload, priority, max_attempts, run_at, delay_s, dedupe_key, deps_total,
                              given_id, given_uid, reinserted, key, tags, trace, ord)
), ins AS (
    INSERT INTO shardworker.jobs (id, uid, reinserted, kind, queue, payload, payload_bytes, priority, max_attempts,
                                  run_at, dedupe_key, status, deps_total, deps_pending, key, tags, trace)
    SELECT id, coalesce(given_uid, (random() * 9.2e18)::bigint), coalesce(reinserted, false), kind, queue,
           payload::jsonb, octet_length(payload), priority, max_attempts,
           coalesce(run_at, now()) + make_interval(secs => delay_s), dedupe_key,
           CASE WHEN deps_total > 0 THEN 'waiting' ELSE 'queued' END, deps_total, deps_total, key,
           CASE WHEN tags IS NOT NULL THEN ARRAY(SELECT jsonb_array_elements_text(tags)) END, trace::jsonb
    FROM f ORDER BY ord
    ON CONFLICT (dedupe_key) WHERE dedupe_key IS NOT NULL AND status IN ('waiting', 'queued', 'running') DO NOTHING
    RETURNING id, dedupe_key
)
SELECT f.ord, coalesce(i.id, (SELECT h.id FROM ins h WHERE h.dedupe_key = f.dedupe_key),
                       (SELECT l.id FROM shardworker.jobs l WHERE l.dedupe_key = f.dedupe_key
                          AND l.status IN ('waiting', 'queued', 'running'))), i.id IS NOT NULL
FROM f LEFT JOIN ins i ON i.id = f.id
ORDER BY f.ord;

-- jobs_reinserted_by_uid --
-- Follow-ups inserted again after the database went back in time, by uid: where the outcomes of
-- theirs that name an id the insert did not get back (another job holds it now) land instead.
SELECT uid, id FROM shardworker.jobs WHERE reinserted AND uid = ANY(%(uids)s::bigint[]);

-- job_ids_reserve --
-- Before jobs are inserted again with the ids they had (follow-ups the database lost when it
-- went back in time): draw from the id sequence until it is past the largest, so no later
-- insert draws one of them (nextval only: a sequence never goes back, whatever other sessions
-- draw meanwhile; at most a million, the gap a lost stretch could leave). False, and nothing
-- drawn, without the right to draw (they then get new ids).
SELECT CASE WHEN NOT has_sequence_privilege(s, 'USAGE') AND NOT has_sequence_privilege(s, 'UPDATE') THEN false
            ELSE (SELECT count(*) FROM generate_series(1, least(1000000, greatest(0,
                      %(max_id)s::bigint - coalesce(pg_sequence_last_value(s), 0)))) g
                  WHERE nextval(s) IS NOT NULL) >= 0 END
FROM (SELECT pg_get_serial_sequence('shardworker.jobs', 'id')::regclass AS s) q;

-- job_dependencies_link --
-- Record edges (job_id waits on depends_on) and mark the dependencies as having dependents.
-- The dependencies are locked (FOR SHARE, in id order) until commit: an outcome applied to
-- one of them meanwhile waits for this transaction, then finds the new edge; one applied
-- before is seen by job_dependencies_settle_new.
WITH e AS (
    SELECT * FROM unnest(%(job_ids)s::bigint[], %(depends_on)s::bigint[]) AS e(job_id, depends_on)
), linked AS (
    INSERT INTO shardworker.job_dependencies (job_id, depends_on)
    SELECT job_id, depends_on FROM e ON CONFLICT DO NOTHING
), locked AS (
    SELECT id, has_dependents FROM shardworker.jobs WHERE id IN (SELECT depends_on FROM e) ORDER BY id FOR SHARE
)
UPDATE shardworker.jobs SET has_dependents = true
WHERE id IN (SELECT id FROM locked WHERE NOT has_dependents);

-- job_dependencies_settle_new --
-- For jobs just inserted waiting (ids), once their edges exist: how many dependencies are
-- not done yet (none: queued now), the size of the done ones' results; a job with a
-- dependency that ended failed or cancelled, or does not exist, is cancelled, and so is
-- every new job behind it. Returns each job's status.
WITH RECURSIVE deps AS (
    SELECT d.job_id, d.depends_on, t.status, octet_length(t.result::text) AS bytes
    FROM shardworker.job_dependencies d LEFT JOIN shardworker.jobs t ON t.id = d.depends_on
    WHERE d.job_id = ANY(%(ids)s::bigint[])
), bad AS (
    SELECT job_id AS id, depends_on AS cause,
           CASE WHEN status IS NULL THEN 'does not exist' ELSE 'ended ' || status END AS why
    FROM deps WHERE status IS NULL OR status IN ('failed', 'cancelled')
    UNION
    SELECT d.job_id, d.depends_on, 'ended cancelled' FROM bad b JOIN deps d ON d.depends_on = b.id
), counts AS (
    SELECT x.id, count(d.job_id) FILTER (WHERE d.status IS DISTINCT FROM 'done') AS pending,
           coalesce(sum(d.bytes) FILTER (WHERE d.status = 'done'), 0) AS bytes
    FROM unnest(%(ids)s::bigint[]) AS x(id) LEFT JOIN deps d ON d.job_id = x.id
    GROUP BY x.id
)
UPDATE shardworker.jobs w
SET status = CASE WHEN b.id IS NOT NULL THEN 'cancelled' WHEN c.pending = 0 THEN 'queued' ELSE 'waiting' END,
    deps_pending = c.pending, deps_bytes = c.bytes,
    last_error = CASE WHEN b.id IS NOT NULL THEN 'waited on job ' || b.cause || ', which ' || b.why END,
    finished_at = CASE WHEN b.id IS NOT NULL THEN now() END
FROM counts c LEFT JOIN (SELECT DISTINCT ON (id) id, cause, why FROM bad ORDER BY id, cause) b ON b.id = c.id
WHERE w.id = c.id
RETURNING w.id, w.status;

-- job_dependents_cancel --
-- Cancel the jobs waiting on these (whys, pairwise: how each ended, e.g. 'ended failed' or
-- 'was deleted'), transitively (shardworker.cancel_dependents). Returns the ids cancelled.
SELECT shardworker.cancel_dependents(%(ids)s::bigint[], %(whys)s::text[]);

-- job_dependency_links --
-- What `jobs show` lists: the jobs this one waits on and those waiting on it, with their
-- kind and status (NULL: deleted), and how many on each side.
SELECT 'dependency' AS side, d.depends_on AS id, j.kind, j.status, count(*) OVER () AS total
FROM shardworker.job_dependencies d LEFT JOIN shardworker.jobs j ON j.id = d.depends_on
WHERE d.job_id = %(id)s
UNION ALL
SELECT 'dependent', d.job_id, j.kind, j.status, count(*) OVER ()
FROM shardworker.job_dependencies d JOIN shardworker.jobs j ON j.id = d.job_id
WHERE d.depends_on = %(id)s
ORDER BY side, id;


-- job_dependents_release --
-- In the transaction that applied them, after job_apply_outcomes (a statement of its own, so
-- it sees the edges of every enqueue whose lock the apply waited for) and after
-- job_dependents_cancel for the jobs that ended failed or cancelled (so a job also behind one
-- of those stays cancelled): the jobs waiting on those applied done. One whose last
-- dependency is now done becomes queued (workers are woken).
WITH released AS (
    -- Waiting jobs with dependencies done here: how many, and their results' size.
    SELECT d.job_id AS id, count(*) AS n, sum(octet_length(j.result::text)) AS bytes
    FROM unnest(%(ids)s::bigint[]) AS e(id)
    JOIN shardworker.jobs j ON j.id = e.id
    JOIN shardworker.job_dependencies d ON d.depends_on = e.id
    GROUP BY d.job_id
), settled AS (
    UPDATE shardworker.jobs w
    SET status = CASE WHEN w.deps_pending - r.n <= 0 THEN 'queued' ELSE 'waiting' END,
        deps_pending = w.deps_pending - r.n, deps_bytes = w.deps_bytes + coalesce(r.bytes, 0),
        updated_at = now()
    FROM released r
    WHERE w.id = r.id AND w.status = 'waiting' AND w.wait_kind IS NULL  -- not one that sleeps or waits for an event
    RETURNING w.id, w.status
), woken AS (
    SELECT pg_notify('shardworker_jobs', '') AS sent FROM settled WHERE status = 'queued' LIMIT 1
)
SELECT id, status FROM settled WHERE (SELECT count(*) FROM woken) >= 0;

-- doctor_oldest_transactions --
-- Sessions holding the xmin horizon back (vacuum cannot remove rows dead since their
-- snapshot), oldest first; this session's own snapshot left out.
SELECT pid, coalesce(application_name, ''), coalesce(state, ''), coalesce(datname, ''),
       extract(epoch FROM clock_timestamp() - xact_start)::float8
FROM pg_stat_activity
WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) AND xact_start IS NOT NULL
  AND pid <> pg_backend_pid()
ORDER BY xact_start
LIMIT 5;

-- doctor_slots_holding --
-- Replication slots that hold the horizon (xmin or catalog_xmin set), with its age in
-- transactions: a slot no one reads (inactive) holds it for ever.
SELECT slot_name, slot_type, active, age(coalesce(xmin, catalog_xmin))::bigint
FROM pg_replication_slots
WHERE xmin IS NOT NULL OR catalog_xmin IS NOT NULL
ORDER BY age(coalesce(xmin, catalog_xmin)) DESC;

-- doctor_jobs_tuples --
-- Live and dead rows of the jobs table as the statistics collector last counted them.
SELECT coalesce(sum(n_live_tup), 0)::bigint, coalesce(sum(n_dead_tup), 0)::bigint,
       max(greatest(last_autovacuum, last_vacuum))
FROM pg_stat_user_tables
WHERE schemaname = 'shardworker' AND relname = 'jobs';

-- doctor_connections --
-- Client connections open on the whole server, against max_connections.
SELECT (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int,
       current_setting('max_connections')::int,
       current_setting('superuser_reserved_connections')::int;

-- outbox_mark_write --
-- Check and advance an outbox's mark by itself (a batch applied in several transactions:
-- written after its last); without mark_batch, only check it (fails when the database went back).
SELECT shardworker.outbox_mark(%(mark_outbox)s::text, %(mark_worker)s::text, %(mark_batch)s::bigint,
                               convert_from(%(mark_positions)s::bytea, 'UTF8')::jsonb, %(mark_expect)s::bigint,
                               %(mark_batch)s::bigint IS NOT NULL);

-- outbox_mark_read --
-- How far the database holds what an outbox's flusher applied: its batch count and positions (no row: nothing).
SELECT batch, positions::text FROM shardworker.outbox_marks WHERE outbox_id = %(outbox_id)s;

-- outbox_marks_all --
-- Every outbox's batch count as the database holds it (doctor compares each with its outbox's own).
SELECT outbox_id, batch FROM shardworker.outbox_marks;

-- claim_hold --
-- Hold every worker's claims until `seconds` from now (by the database's clock), or move this holder's on.
INSERT INTO shardworker.claim_holds (holder, reason, until)
VALUES (%(holder)s, %(reason)s, now() + make_interval(secs => %(seconds)s))
ON CONFLICT (holder) DO UPDATE SET reason = excluded.reason, until = excluded.until;

-- claim_unhold --
-- End one holder's hold (and forget holds long over: a worker that died holding one).
DELETE FROM shardworker.claim_holds WHERE holder = %(holder)s OR until < now() - interval '1 hour';

-- claim_holds_live --
-- The holds live now: who holds claims, why, and for how many more seconds.
SELECT holder, reason, extract(epoch FROM until - now())::float8 FROM shardworker.claim_holds
WHERE until > now() ORDER BY until DESC;

-- server_identity --
-- Which server process and which database this session reached: another value than before
-- means another server (a failover, a physical restore), a restart, or the database made
-- anew (a logical restore), after any of which the database may be older than it was.
SELECT shardworker.server_identity();

-- claim_settle --
-- A worker that reached a new server holds every worker's claims until each worker that was
-- beating around the database's latest state (in the last `window_s` of the beats made before
-- this server: they may have lost work to it) and each already on it has said it checked its
-- outbox's mark there (worker_checked), or until `seconds` from now.
INSERT INTO shardworker.claim_holds (holder, reason, until, server, waits_for)
SELECT %(holder)s, %(reason)s, now() + make_interval(secs => %(seconds)s), %(server)s,
       ARRAY(SELECT w.worker_id FROM shardworker.workers w
             WHERE w.kinds IS NOT NULL
               AND (w.server IS NOT DISTINCT FROM %(server)s
                    OR w.heartbeat_at >= (SELECT max(o.heartbeat_at) FROM shardworker.workers o
                                          WHERE o.kinds IS NOT NULL AND o.server IS DISTINCT FROM %(server)s)
                                         - make_interval(secs => %(window_s)s)))
ON CONFLICT (holder) DO UPDATE
SET reason = excluded.reason, until = excluded.until, server = excluded.server, waits_for = excluded.waits_for;

-- claim_settle_end --
-- End a new server's hold once every worker it waits for has checked its mark there. Returns
-- the workers still awaited (none: it ended).
WITH pending AS (
    SELECT w AS worker_id FROM shardworker.claim_holds h, unnest(h.waits_for) AS w
    WHERE h.holder = %(holder)s
      AND NOT EXISTS (SELECT FROM shardworker.workers x WHERE x.worker_id = w AND x.checked_server = h.server)
), ended AS (
    DELETE FROM shardworker.claim_holds WHERE holder = %(holder)s AND NOT EXISTS (SELECT FROM pending)
)
SELECT worker_id FROM pending;

-- worker_checked --
-- This worker has checked, on this server, that the database holds what its outbox applied.
-- Returns whether its row took it (none: the row is being written again by its heartbeat).
UPDATE shardworker.workers SET checked_server = %(server)s WHERE worker_id = %(worker_id)s RETURNING 1;

-- job_reclaim --
-- Claims the database lost by going back in time, made again for the jobs this worker holds
-- (sent to its children, not finished): a row as it was before that claim (queued, waiting or
-- running an older attempt, of the same job) is claimed again with that claim's attempt and
-- token, so no other worker claims it, and its outcome lands as usual. Returns the ids claimed again.
UPDATE shardworker.jobs j
SET status = 'running', attempt = r.attempt, locked_by = %(worker_id)s, claim_token = r.token,
    rescued_attempt = NULL, attempted_at = now(), updated_at = now()
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(uids)s::bigint[], %(tokens)s::text[]) AS r(id, attempt, uid, token)
WHERE j.id = r.id AND (r.uid IS NULL OR j.uid IS NULL OR j.uid = r.uid)
  AND j.status IN ('queued', 'waiting', 'running') AND j.attempt < r.attempt AND coalesce(j.applied_attempt, 0) < r.attempt
RETURNING j.id;

-- job_apply_preview --
-- outbox reapply --dry-run: which of these outcomes job_apply_outcomes would apply to the rows
-- as they are now: its fence, read only (keep the two in step: tests/store/test_claim_identity.py
-- compares them).
SELECT DISTINCT o.id
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(uids)s::bigint[], %(tokens)s::text[]) AS o(id, attempt, uid, token)
JOIN shardworker.jobs j ON j.id = o.id
WHERE (o.uid IS NULL OR j.uid IS NULL OR j.uid = o.uid)
  AND ((j.attempt = o.attempt AND (o.token IS NULL OR j.claim_token IS NULL OR j.claim_token = o.token)
        AND (j.status = 'running' OR (j.rescued_attempt = o.attempt AND j.status IN ('queued', 'failed'))))
       OR (o.uid IS NOT NULL AND j.attempt < o.attempt AND j.status IN ('queued', 'waiting', 'running')
           AND coalesce(j.applied_attempt, 0) < o.attempt));
