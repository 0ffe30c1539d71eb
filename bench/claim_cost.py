"""What one claim costs the worker's parent: its CPU (client side: psycopg building and
reading the pipeline) and its wall time (round trip, the server's planning and running),
for a claim that finds nothing and for one that takes a job, on a table holding
``--done`` finished jobs. The parent claims hundreds of times a second when jobs arrive one
at a time (bench/latency.py), so this is most of its CPU there.

Usage::

    python bench/claim_cost.py                 # embedded PostgreSQL
    python bench/claim_cost.py --dsn postgresql://...   # a scratch database (truncates shardworker.jobs)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import psycopg

from shardworker.store.pg_store import PgStore, StoreConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_db import database


def per_claim(store: PgStore, n: int, enqueue_first: bool) -> tuple[float, float]:
    """(CPU µs, wall µs) per claim over ``n`` claims."""
    cpu = wall = 0.0
    for _ in range(n):
        if enqueue_first:
            store.enqueue("noop", "null", queue="default", priority=0, max_attempts=3, run_at=None, delay_s=0,
                          dedupe_key=None)
        c0, t0 = time.process_time(), time.perf_counter()
        store.claim_within(["noop"], None, "bench", 50, "token", caps={}, run_room=50, attempts={"noop": 3})
        cpu += time.process_time() - c0
        wall += time.perf_counter() - t0
    return cpu / n * 1e6, wall / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None)
    parser.add_argument("-n", type=int, default=2000, help="claims per measurement (default 2000)")
    parser.add_argument("--done", type=int, default=30_000, help="finished jobs in the table (default 30,000)")
    args = parser.parse_args()
    with database(args.dsn) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("TRUNCATE shardworker.jobs CASCADE")
            conn.execute("INSERT INTO shardworker.jobs (kind, queue, payload, status, finished_at) "
                         "SELECT 'noop', 'default', '{}', 'done', now() FROM generate_series(1, %s)", (args.done,))
            conn.execute("VACUUM ANALYZE shardworker.jobs")
        store = PgStore(StoreConfig(dsn=dsn))
        try:
            per_claim(store, 50, False)  # connect, prepare
            for label, first in (("empty claim", False), ("claim of 1 job", True)):
                cpu, wall = per_claim(store, args.n, first)
                print(f"{label}: parent CPU {cpu:.0f} µs, wall {wall:.0f} µs (mean of {args.n})", flush=True)
        finally:
            store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
