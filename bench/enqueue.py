"""Cost of ``shardworker.enqueue`` on a borrowed connection, beside plain INSERTs of the same row.

An application enqueues on its own connection, one job per request: this is the call it
pays for. On one autocommit connection, in interleaved rounds, the script times

* ``plain INSERT``: the same row, no RETURNING (the issue's yardstick);
* ``INSERT RETURNING id``: what any API that hands back the id must do;
* ``job_insert SQL``: shardworker's INSERT run raw (dedupe ``ON CONFLICT``, RETURNING), no
  Python around it (``enqueue`` sends its ``pg_notify`` as a second statement);
* ``enqueue(conn, ...)``: the public call (validation, orjson, the statement);
* ``validate + encode``: the Python part alone, no database;

then the same with a real ``shardworker run`` claiming the jobs as they arrive (it LISTENs,
so every NOTIFY is delivered to a backend), and ``enqueue_many`` of 10,000 jobs beside a plain
``COPY`` of the same rows into the jobs table. Each figure is the median over ``--rounds``.
The difference between the rows says where ``enqueue`` spends what a plain INSERT does not.

Usage::

    python bench/enqueue.py                     # embedded PostgreSQL
    python bench/enqueue.py --calls 5000 --rounds 7 --dsn postgresql://...
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from throughput import KIND, code_version, database, worker_command, write_app

from shardworker import JobSpec, enqueue, enqueue_many
from shardworker.store.sql import query

PAYLOAD = {"url": "https://example.com/a.png", "size": [640, 480]}
PAYLOAD_JSON = '{"url":"https://example.com/a.png","size":[640,480]}'
ROW = (KIND, "default", PAYLOAD_JSON, 0, 25)
PLAIN_INSERT = ("INSERT INTO shardworker.jobs (kind, queue, payload, priority, max_attempts) "
                "VALUES (%s, %s, %s::jsonb, %s, %s)")
PLAIN_RETURNING = PLAIN_INSERT + " RETURNING id"
BULK = 10_000


def single_calls(conn: psycopg.Connection[Any]) -> dict[str, Callable[[], object]]:
    """The single-row variants, cheapest first; each inserts one row (but the last)."""
    params = {"kind": KIND, "queue": "default", "payload": PAYLOAD_JSON, "priority": 0, "max_attempts": 25,
              "run_at": None, "delay_s": 0.0, "dedupe_key": None, "key": None, "dedupe_window_s": None,
              "tags": None, "trace": None}
    job_insert = query("job_insert")
    return {
        "plain INSERT": lambda: conn.execute(PLAIN_INSERT, ROW),
        "INSERT RETURNING id": lambda: conn.execute(PLAIN_RETURNING, ROW).fetchone(),
        "job_insert SQL": lambda: conn.execute(job_insert, params).fetchone(),
        "enqueue(conn, ...)": lambda: enqueue(conn, KIND, PAYLOAD),
        "validate + encode": lambda: JobSpec(KIND, PAYLOAD).payload_json(),
    }


def time_per_call(call: Callable[[], object], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - t0) / calls


def bulk_calls(conn: psycopg.Connection[Any]) -> dict[str, Callable[[], object]]:
    specs = [JobSpec(KIND, PAYLOAD) for _ in range(BULK)]

    def plain_copy() -> None:
        with conn.transaction(), conn.cursor() as cur, cur.copy(
                "COPY shardworker.jobs (kind, queue, payload, priority, max_attempts) FROM STDIN") as copy:
            for _ in range(BULK):
                copy.write_row(ROW)

    return {f"plain COPY of {BULK:,}": plain_copy, f"enqueue_many of {BULK:,}": lambda: enqueue_many(conn, specs)}


def measure(dsn: str, calls: int, rounds: int) -> dict[str, list[float]]:
    """Seconds per call for every variant, one list entry per round, variants interleaved."""
    samples: dict[str, list[float]] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        singles, bulks = single_calls(conn), bulk_calls(conn)
        for call in singles.values():
            time_per_call(call, 200)  # warm-up: psycopg prepares a statement on its 5th run
        for _ in range(rounds):
            for name, call in singles.items():
                samples.setdefault(name, []).append(time_per_call(call, calls))
            for name, call in bulks.items():
                samples.setdefault(name, []).append(time_per_call(call, 1))
    return samples


def start_worker(dsn: str, app_dir: str, outbox_dir: str, log_path: Path) -> subprocess.Popen[bytes]:
    """A real ``shardworker run --procs 2`` that claims the bench's jobs as they arrive."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [app_dir, os.environ.get("PYTHONPATH")]))}
    cmd = [arg for arg in worker_command(dsn, 2, outbox_dir) if arg != "--exit-when-idle"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
    with psycopg.connect(dsn, autocommit=True) as conn:  # wait for its heartbeat: it is claiming
        deadline = time.monotonic() + 60
        while not conn.execute("SELECT count(*) FROM shardworker.workers").fetchone()[0]:  # type: ignore[index]
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start; see {log_path}")
            time.sleep(0.1)
    return proc


def report(title: str, samples: dict[str, list[float]]) -> None:
    med = {name: statistics.median(values) for name, values in samples.items()}
    base = med["plain INSERT"]
    print(f"\n{title}")
    for name, seconds in med.items():
        ratio = "" if name.startswith(("plain COPY", "enqueue_many")) else f"  {seconds / base:5.2f}x plain INSERT"
        count = BULK if name.startswith(("plain COPY", "enqueue_many")) else 1
        print(f"  {name:<24} {seconds * 1000:8.3f} ms/call {count / seconds:>10,.0f} jobs/s{ratio}")
    spent = med["enqueue(conn, ...)"] - base
    print(f"  enqueue spends {spent * 1000:.3f} ms more than a plain INSERT: "
          f"RETURNING {(med['INSERT RETURNING id'] - base) * 1000:.3f}, "
          f"dedupe ON CONFLICT {(med['job_insert SQL'] - med['INSERT RETURNING id']) * 1000:.3f}, "
          f"Python and the NOTIFY {(med['enqueue(conn, ...)'] - med['job_insert SQL']) * 1000:.3f}")
    verdict = "meets" if med["enqueue(conn, ...)"] <= 1.5 * base else "misses"
    print(f"  target enqueue <= 1.5x plain INSERT: {med['enqueue(conn, ...)'] / base:.2f}x, {verdict} it")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help="a scratch database (default: a temporary embedded server)")
    parser.add_argument("--calls", type=int, default=2000, help="single calls per variant per round (default 2000)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians are shown (default 5)")
    args = parser.parse_args(argv)
    print(f"shardworker {code_version()}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"{args.calls} calls x {args.rounds} rounds", flush=True)
    work_dir = tempfile.mkdtemp(prefix="sw-bench-enqueue-")
    try:
        write_app(work_dir)
        with database(args.dsn) as dsn:
            report("no worker running", measure(dsn, args.calls, args.rounds))
            worker = start_worker(dsn, work_dir, os.path.join(work_dir, "outbox"), Path(work_dir, "worker.log"))
            try:
                report("a worker (--procs 2) claiming the jobs as they arrive",
                       measure(dsn, args.calls, args.rounds))
            finally:
                worker.terminate()
                worker.wait(60)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
