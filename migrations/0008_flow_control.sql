-- 0008_flow_control: why: limits that hold across every worker on the database (a kind's
-- global_concurrency and rate, a queue's concurrency and rate, a paused queue) must be
-- enforced where the claims meet, in PostgreSQL; and a backlog worth alerting on must be
-- counted without reading finished rows.

-- A kind's limits across workers, written by each worker at start from its handlers
-- (global_concurrency=, rate=): the last worker to start sets them. The row is also the
-- lock that serializes the claims of a limited kind, and holds its rate's token bucket.
CREATE TABLE shardworker.kinds (
    name                text        PRIMARY KEY,
    global_concurrency  int         CHECK (global_concurrency >= 1),
    rate_limit          int         CHECK (rate_limit >= 1),
    rate_period_s       float8      CHECK (rate_period_s > 0),
    rate_tokens         float8      NOT NULL DEFAULT 0,
    rate_at             timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate_limit IS NULL) = (rate_period_s IS NULL))
);

-- A queue's state, set at run time by an operator (`shardworker queues ...`): paused, and
-- limits across workers. A queue without a row runs unpaused and unlimited.
CREATE TABLE shardworker.queues (
    name           text        PRIMARY KEY,
    paused         boolean     NOT NULL DEFAULT false,
    concurrency    int         CHECK (concurrency >= 1),
    rate_limit     int         CHECK (rate_limit >= 1),
    rate_period_s  float8      CHECK (rate_period_s > 0),
    rate_tokens    float8      NOT NULL DEFAULT 0,
    rate_at        timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate_limit IS NULL) = (rate_period_s IS NULL))
);

-- A claim reads a limited queue's or a limited kind's due jobs apart, best first: these
-- walk them in claim order (priority, run_at, id) without passing other jobs. The queue's
-- also carries the kind, so the backlog by queue and kind (available, scheduled, oldest
-- due) is an index-only scan of queued rows. Names bounded as in 0007 so that no row can
-- overflow an index.
CREATE INDEX jobs_queued_by_queue_idx
    ON shardworker.jobs (left(queue, 255), priority, run_at, id, left(kind, 255))
    WHERE status = 'queued';
CREATE INDEX jobs_queued_by_kind_idx ON shardworker.jobs (left(kind, 255), priority, run_at, id)
    WHERE status = 'queued';

-- Limited claims count the running jobs of a kind or a queue; so do the running gauges.
CREATE INDEX jobs_running_names_idx ON shardworker.jobs (left(kind, 255), left(queue, 255))
    WHERE status = 'running';

-- Each worker's jobs claimed and not started, and started, by queue and kind, as of its
-- last heartbeat: [[queue, kind, prefetched, running], ...]. `queues` and `stats` add them up.
ALTER TABLE shardworker.workers ADD COLUMN flow jsonb;

-- The backlog gauges of `run --metrics-port`: one worker at a time (the one that takes this
-- row's lock) computes the backlog by queue and kind, at most every few seconds; every
-- worker's /metrics shows the last one computed, with its age.
CREATE TABLE shardworker.backlog_report (
    id           int         PRIMARY KEY CHECK (id = 1),
    computed_at  timestamptz NOT NULL DEFAULT 'epoch',
    rows         jsonb       NOT NULL DEFAULT '[]'
);
INSERT INTO shardworker.backlog_report (id) VALUES (1);
