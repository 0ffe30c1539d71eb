"""How long the backlog by queue and kind takes (``PgStore.backlog``, what ``shardworker
queues`` and the gauges read) on a table of many finished jobs.

``python bench/backlog.py`` starts a temporary embedded PostgreSQL (or use ``--dsn`` with a
scratch database: it truncates ``shardworker.jobs``), loads ``--finished`` done jobs (10
million by default, a million a statement), ``--queued`` queued jobs (a tenth of them
scheduled an hour ahead) and ``--running`` claimed ones over 5 queues and 4 kinds, with a
live worker's flow report, then VACUUM ANALYZE (what autovacuum would have done). It times
``--rounds`` calls and prints their median, p90 and max, the pages the statement touched
and how it read the jobs table (EXPLAIN ANALYZE BUFFERS): they follow the unfinished rows,
not the table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg
from bench_db import database  # bench/bench_db.py: the script's directory is on sys.path

from shardworker.core.views import FlowCount
from shardworker.store.pg_store import PgStore, StoreConfig
from shardworker.store.sql import query

QUEUES, KINDS = 5, 4
CHUNK = 1_000_000


def load(dsn: str, finished: int, queued: int, running: int) -> None:
    """Empty the table, then fill it with done, queued and claimed jobs; vacuum and analyze."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE shardworker.jobs CASCADE")  # and job_steps, job_dependencies
        started = time.monotonic()
        for low in range(0, finished, CHUNK):
            conn.execute("INSERT INTO shardworker.jobs (kind, queue, payload, status, attempt, finished_at) "
                         "SELECT 'kind' || (i %% %(k)s), 'queue' || (i %% %(q)s), 'null', 'done', 1, "
                         "now() - make_interval(secs => i %% 86400) FROM generate_series(%(lo)s, %(hi)s) i",
                         {"k": KINDS, "q": QUEUES, "lo": low + 1, "hi": min(finished, low + CHUNK)})
            print(f"  {min(finished, low + CHUNK):,} done jobs ({time.monotonic() - started:.0f}s)", flush=True)
        conn.execute("INSERT INTO shardworker.jobs (kind, queue, payload, run_at) "
                     "SELECT 'kind' || (i %% %(k)s), 'queue' || (i %% %(q)s), 'null', "
                     "now() + CASE WHEN i %% 10 = 0 THEN interval '1 hour' ELSE -make_interval(secs => i %% 600) END "
                     "FROM generate_series(1, %(n)s) i", {"k": KINDS, "q": QUEUES, "n": queued})
        conn.execute("INSERT INTO shardworker.jobs (kind, queue, payload, status, attempt, locked_by) "
                     "SELECT 'kind' || (i %% %(k)s), 'queue' || (i %% %(q)s), 'null', 'running', 1, 'bench' "
                     "FROM generate_series(1, %(n)s) i", {"k": KINDS, "q": QUEUES, "n": running})
        conn.execute("VACUUM ANALYZE shardworker.jobs")


def plan_summary(dsn: str) -> tuple[int, list[str]]:
    """(shared buffers the backlog statement touched, hit or read; how it read the jobs table),
    from EXPLAIN ANALYZE BUFFERS."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query("queue_backlog"),
                           {"live_within_s": 60.0}).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    scans, nodes = [], [plan]
    while nodes:
        node = nodes.pop()
        nodes.extend(node.get("Plans", []))
        if node.get("Relation Name") == "jobs" or "Index Name" in node:
            scans.append(f"{node['Node Type']} {node.get('Index Name', '')}".strip())
    return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0)), sorted(scans)


def measure(dsn: str, rounds: int) -> list[float]:
    """Milliseconds of each of ``rounds`` backlog reads, a worker's flow report in place."""
    store = PgStore(StoreConfig(dsn=dsn, statement_timeout_s=600))
    try:
        store.heartbeat("bench", "bench-host", 1, 0, 0, [FlowCount(f"queue{q}", f"kind{q % KINDS}", 3, 1)
                                                        for q in range(QUEUES)])
        store.backlog()  # warm the connection and the caches
        took = []
        for _ in range(rounds):
            started = time.perf_counter()
            rows = store.backlog()
            took.append((time.perf_counter() - started) * 1000)
        assert rows, "no backlog rows"
        return took
    finally:
        store.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help="A scratch database (its jobs table is emptied).")
    parser.add_argument("--finished", type=int, default=10_000_000, help="Done jobs in the table.")
    parser.add_argument("--queued", type=int, default=10_000, help="Queued jobs (a tenth scheduled later).")
    parser.add_argument("--running", type=int, default=500, help="Claimed jobs.")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    with database(args.dsn) as dsn:
        print(f"loading {args.finished:,} done, {args.queued:,} queued and {args.running:,} running jobs", flush=True)
        load(dsn, args.finished, args.queued, args.running)
        took = sorted(measure(dsn, args.rounds))
        p90 = took[min(len(took) - 1, int(len(took) * 0.9))]
        pages, scans = plan_summary(dsn)
        print(f"backlog over {args.finished:,} done jobs: median {statistics.median(took):.1f} ms, "
              f"p90 {p90:.1f} ms, max {took[-1]:.1f} ms ({args.rounds} rounds); "
              f"{pages:,} pages touched; jobs read by: {', '.join(scans)}")


if __name__ == "__main__":
    main()
