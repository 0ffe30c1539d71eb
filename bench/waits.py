"""Waiting jobs hold nothing: is a worker as fast with 1,000 jobs waiting as with none?

Issue 44's measure: ``--jobs`` no-op jobs queued, run by ``shardworker run --procs 2
--exit-when-idle`` (a real subprocess) from launch to exit, in rounds that alternate between an
empty table and one where ``--waiting`` jobs already wait: half asleep (``job.sleep`` for an
hour), half waiting for an event nobody sends (``job.wait_event``), put there by a worker of
their own first. A round's rate is its no-op jobs over the span from their first claim to their
last finish. The target: the same throughput (medians within the noise, about 10% here).

Usage::

    python bench/waits.py                        # embedded PostgreSQL, 20,000 jobs, 1,000 waiting, 3 rounds
    python bench/waits.py --jobs 50000 --waiting 5000 --repeat 5 --dsn postgresql://...
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_db import database

from shardworker import JobSpec, enqueue_many

MAX_DROP = 0.10
APP = '''
from shardworker import App

app = App()


@app.handler("wait_noop")
def noop(job):
    return None


@app.handler("wait_sleeper")
def sleeper(job):
    job.sleep("an hour", 3600)


@app.handler("wait_for_event")
def waiter(job):
    job.wait_event("approval", f"never:{job.id}")
'''


def run_worker(dsn: str, work_dir: str) -> float:
    """Run a worker until it is idle; seconds from launch to exit."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [work_dir, os.environ.get("PYTHONPATH")]))}
    env.pop("SHARDWORKER_DSN", None)
    started = time.monotonic()
    with Path(work_dir, "worker.log").open("ab") as log:
        proc = subprocess.run([sys.executable, "-m", "shardworker", "run", "--app", "waits_bench_app", "--procs", "2",
                               "--exit-when-idle", "--outbox-dir", tempfile.mkdtemp(dir=work_dir), "--dsn", dsn],
                              env=env, stdout=log, stderr=log, cwd=work_dir, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"the worker exited {proc.returncode}: see {work_dir}/worker.log")
    return time.monotonic() - started


def one_round(dsn: str, args: argparse.Namespace, work_dir: str, waiting: int) -> tuple[float, float, int]:
    """(no-op jobs a second over their span, launch to exit in seconds, jobs left waiting)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE shardworker.jobs, shardworker.events CASCADE")
        if waiting:
            enqueue_many(conn, (JobSpec("wait_sleeper" if n % 2 else "wait_for_event") for n in range(waiting)))
            run_worker(dsn, work_dir)  # they run once, up to their wait, and stay waiting
        enqueue_many(conn, (JobSpec("wait_noop") for _ in range(args.jobs)))
        conn.execute("VACUUM ANALYZE shardworker.jobs")
        wall = run_worker(dsn, work_dir)
        row = conn.execute("SELECT count(*), extract(epoch FROM max(finished_at) - min(attempted_at)) "
                           "FROM shardworker.jobs WHERE kind = 'wait_noop' AND status = 'done'").fetchone()
        left = conn.execute("SELECT count(*) FROM shardworker.jobs WHERE status = 'waiting'").fetchone()
    assert row is not None and left is not None and row[0] == args.jobs, row
    return row[0] / float(row[1]), wall, int(left[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help="a scratch database (truncates shardworker.jobs and events); "
                                                    "default: a temporary embedded server")
    parser.add_argument("--jobs", type=int, default=20_000, help="no-op jobs a round (default 20,000)")
    parser.add_argument("--waiting", type=int, default=1_000, help="jobs waiting beside them (default 1,000)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of each (default 3)")
    args = parser.parse_args(argv)
    print(f"{args.jobs:,} no-op jobs on --procs 2, beside 0 or {args.waiting:,} waiting jobs "
          "(half asleep, half waiting for an event)", flush=True)
    rates: dict[int, list[float]] = {0: [], args.waiting: []}
    with database(args.dsn) as dsn:
        work_dir = tempfile.mkdtemp(prefix="sw-bench-waits-")
        try:
            Path(work_dir, "waits_bench_app.py").write_text(APP)
            for _ in range(args.repeat):
                for waiting in (0, args.waiting):
                    rate, wall, left = one_round(dsn, args, work_dir, waiting)
                    rates[waiting].append(rate)
                    print(f"{waiting:>6,} waiting: {rate:,.0f} jobs/s (launch to exit {wall:.1f} s; {left:,} still "
                          f"waiting after)  [load {os.getloadavg()[0]:.1f}]", flush=True)
        finally:
            shutil.rmtree(work_dir, ignore_errors=True)
    alone, beside = statistics.median(rates[0]), statistics.median(rates[args.waiting])
    drop = 1 - beside / alone
    print(f"medians: {alone:,.0f} jobs/s alone, {beside:,.0f} beside {args.waiting:,} waiting jobs ({drop:+.1%}: "
          f"{'meets' if drop <= MAX_DROP else 'misses'} <= {MAX_DROP:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
