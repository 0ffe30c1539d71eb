"""The queues' store: the backlog by queue and kind (available, scheduled, prefetched and
running from the live workers' heartbeat reports, the oldest available job's age) read
from queued and running rows only, and the operator's state of a queue (paused, limits
across workers) kept in shardworker.queues. Real PostgreSQL."""

from __future__ import annotations

import re

from shardworker.core.flow import Rate
from shardworker.core.views import BacklogRow, FlowCount, QueueState
from shardworker.store.pg_store import PgStore
from shardworker.store.sql import query as sql_of
from tests.helpers import execute, query
from tests.store.support import add_id, connect


def test_backlog_splits_queued_jobs_and_running_ones_by_what_workers_report(store: PgStore, pg_dsn: str) -> None:
    """Per (queue, kind): due and later jobs apart; of the claimed jobs, what live workers report
    prefetched (never more than are claimed) and the rest as running; a silent worker's report
    and finished jobs count for nothing; a queue with a state row and no jobs has a row too."""
    for _ in range(4):
        add_id(store, "send", queue="mail")
    for _ in range(2):
        add_id(store, "send", queue="mail", delay_s=3600)
    add_id(store, "resize", queue="images")
    execute(pg_dsn, "UPDATE shardworker.jobs SET run_at = now() - interval '30 seconds' "
                    "WHERE id = (SELECT min(id) FROM shardworker.jobs)")
    assert len(store.claim(["send"], ["mail"], "w1", 3)) == 3
    [done] = store.claim(["resize"], None, "w1", 1)
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'done', finished_at = now() WHERE id = %s", done.id)
    store.heartbeat("w1", "host", 1, 3, 0, [FlowCount("mail", "send", 2, 1), FlowCount("images", "resize", 5, 0)])
    store.heartbeat("w-silent", "host", 2, 9, 0, [FlowCount("mail", "send", 9, 0)])
    execute(pg_dsn, "UPDATE shardworker.workers SET heartbeat_at = now() - interval '1 hour' "
                    "WHERE worker_id = 'w-silent'")
    store.pause_queue("idle")

    rows = {(r.queue, r.kind): r for r in store.backlog()}
    assert set(rows) == {("mail", "send"), ("idle", None)}
    mail = rows[("mail", "send")]
    assert mail[:6] == ("mail", "send", 1, 2, 2, 1)
    assert mail.oldest_available_s is not None and 0 <= mail.oldest_available_s < 30
    assert rows[("idle", None)] == BacklogRow("idle", None, 0, 0, 0, 0, None)


def test_backlog_counts_the_oldest_available_job_and_never_a_negative_running(store: PgStore,
                                                                               pg_dsn: str) -> None:
    """The age is now - run_at of the oldest due job; a report of more prefetched jobs than are
    claimed counts them all as prefetched and none as running."""
    first = add_id(store, "k")
    add_id(store, "k")
    execute(pg_dsn, "UPDATE shardworker.jobs SET run_at = now() - interval '90 seconds' WHERE id = %s", first)
    store.claim(["k"], None, "w1", 1)
    store.heartbeat("w1", "host", 1, 1, 0, [FlowCount("default", "k", 4, 0)])
    [row] = store.backlog()
    assert row[:6] == ("default", "k", 1, 0, 1, 0)
    assert row.oldest_available_s is not None and row.oldest_available_s < 90


def test_pause_resume_and_limits_round_trip_keeping_what_is_not_given(store: PgStore, pg_dsn: str) -> None:
    """Pause and resume keep the limits; a limit keeps the other limit and the pause; clear
    removes both limits; a new rate resets the bucket, the same rate keeps it."""
    assert store.queue_states() == []
    assert store.pause_queue("mail") == QueueState("mail", True, None, None)
    assert store.limit_queue("mail", concurrency=5) == QueueState("mail", True, 5, None)
    assert store.limit_queue("mail", rate=Rate(10, 1.0)) == QueueState("mail", True, 5, Rate(10, 1.0))
    execute(pg_dsn, "UPDATE shardworker.queues SET rate_tokens = 3, rate_at = now() - interval '1 hour'")
    store.limit_queue("mail", rate=Rate(10, 1.0), concurrency=7)
    assert query(pg_dsn, "SELECT rate_tokens, rate_at < now() - interval '59 minutes', concurrency "
                         "FROM shardworker.queues") == [(3.0, True, 7)]
    store.limit_queue("mail", rate=Rate(600, 60.0))
    assert query(pg_dsn, "SELECT rate_tokens, rate_at > now() - interval '1 minute', rate_limit, rate_period_s "
                         "FROM shardworker.queues") == [(0.0, True, 600, 60.0)]
    assert store.resume_queue("mail") == QueueState("mail", False, 7, Rate(600, 60.0))
    assert store.limit_queue("mail", clear=True) == QueueState("mail", False, None, None)
    store.limit_queue("bulk", rate=Rate(5, 3600.0))
    assert store.queue_states() == [QueueState("bulk", False, None, Rate(5, 3600.0)),
                                    QueueState("mail", False, None, None)]
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.queues WHERE updated_at > now() - interval '1 minute'") \
        == [(2,)]


def test_the_backlog_reads_no_finished_row(store: PgStore, pg_dsn: str) -> None:
    """On 200,000 done jobs and a few queued and running ones, the backlog reads jobs only
    through partial indexes of queued or running rows (no scan of the table), a few pages."""
    execute(pg_dsn, "INSERT INTO shardworker.jobs (kind, queue, payload, status, finished_at) "
                    "SELECT 'k' || (i % 7), 'q' || (i % 3), 'null', 'done', now() FROM generate_series(1, 200000) i")
    for n in range(20):
        add_id(store, f"k{n % 3}", queue=f"q{n % 2}")
    store.claim(["k0", "k1"], None, "w1", 5)
    execute(pg_dsn, "ANALYZE shardworker.jobs")
    unfinished = {name for name, definition in query(pg_dsn, "SELECT indexname, indexdef FROM pg_indexes "
                                                             "WHERE schemaname = 'shardworker'")
                  if re.search(r"WHERE \(status = '(queued|running)'::text\)$", definition)}
    assert {"jobs_queued_by_queue_idx", "jobs_running_names_idx"} <= unfinished
    with connect(pg_dsn) as conn:
        found = conn.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql_of("queue_backlog"),
                             {"live_within_s": 60.0})
        plan = "\n".join(r[0] for r in found.fetchall()).split("\nPlanning:")[0]
    assert "Seq Scan on jobs" not in plan, plan
    used = set(re.findall(r"(?:Index Scan|Index Only Scan|Bitmap Index Scan) (?:using|on) (\w+)", plan))
    assert used and used <= unfinished, plan
    pages = max(sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", line))
                for line in plan.splitlines() if "Buffers:" in line)
    assert pages < 100, plan  # the done rows alone fill over a thousand pages
    assert len(store.backlog()) == 6  # every (queue, kind) of the 20
