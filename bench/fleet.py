"""Many workers on one database, and many writers enqueuing into it (issue 27 point 3).

**The fleet**: ``--workers`` (default 8) ``shardworker run --procs 1 --exit-when-idle``
subprocesses, each with its own outbox directory and ``--worker-id``, work ``-n`` (default
200,000) queued jobs together. The handler appends each job id it runs to its worker's own
ledger file, so the bench checks that every job ran exactly once, counted inside the
handler. It prints total jobs/s (wall: launch to the last exit; span: first claim to last
finish, from the table), each worker's share, and the connections each worker holds, sampled
every 0.5 s from ``pg_stat_activity`` (see ``fleet_conns.py`` for how a connection is
traced to its worker and process).

**The writers** (``fleet_enqueue.py``): ``--writers`` (default 16) processes, each on its
own autocommit connection, enqueue single jobs as fast as they can for ``--seconds``, in
interleaved rounds with and without NOTIFY; printed side by side.

Usage::

    python bench/fleet.py                            # embedded PostgreSQL
    python bench/fleet.py -n 20000 --part fleet      # a quick fleet only
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_db import load_jobs, table_span
from fleet_conns import connections_by_worker
from fleet_enqueue import compare_enqueue
from throughput import code_version, database, worker_command, write_app

KIND = "bench_ledger"


def start_fleet(dsn: str, work_dir: str, workers: int) -> list[subprocess.Popen[bytes]]:
    """Launch the workers: --procs 1 each, their own outbox, worker id and ledger."""
    procs = []
    for k in range(workers):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [work_dir, os.environ.get("PYTHONPATH")])),
               "BENCH_LEDGER": str(Path(work_dir, f"ledger-{k}"))}
        env.pop("SHARDWORKER_DSN", None)
        outbox = tempfile.mkdtemp(prefix=f"outbox-{k}-", dir=work_dir)
        log = Path(work_dir, f"worker-{k}.log").open("wb")  # noqa: SIM115 (the worker's; the bench's exit closes it)
        procs.append(subprocess.Popen(worker_command(dsn, 1, outbox, ("--worker-id", f"fleet-{k}")), env=env,
                                      stdout=log, stderr=log))
    return procs


def watch(dsn: str, procs: list[subprocess.Popen[bytes]]) -> list[Counter[str]]:
    """Sample each worker's connections every 0.5 s until all exit; the most each held at once."""
    most: list[Counter[str]] = [Counter() for _ in procs]
    with psycopg.connect(dsn, autocommit=True) as conn:
        while any(p.poll() is None for p in procs):
            for k, held in enumerate(connections_by_worker(conn, [p.pid for p in procs])):
                if sum(held.values()) > sum(most[k].values()):
                    most[k] = held
            time.sleep(0.5)
    return most


def check_ledgers(work_dir: str, workers: int, n: int) -> list[int]:
    """Every job id in exactly one ledger line; the runs per worker."""
    runs: Counter[int] = Counter()
    per_worker = []
    for k in range(workers):
        path = Path(work_dir, f"ledger-{k}")
        ids = [int(line) for line in path.read_text().split()] if path.exists() else []
        runs.update(ids)
        per_worker.append(len(ids))
    twice = sum(1 for c in runs.values() if c > 1)
    if len(runs) != n or twice:
        raise RuntimeError(f"{len(runs)} distinct jobs ran (expected {n}), {twice} more than once")
    return per_worker


def run_fleet(dsn: str, args: argparse.Namespace, work_dir: str) -> None:
    """The fleet on ``-n`` queued jobs: rate, shares, connections."""
    load_jobs(dsn, args.n, KIND)
    launched = time.time()
    procs = start_fleet(dsn, work_dir, args.workers)
    most = watch(dsn, procs)
    wall = time.time() - launched
    bad = [k for k, p in enumerate(procs) if p.returncode != 0]
    if bad:
        tail = Path(work_dir, f"worker-{bad[0]}.log").read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(f"workers {bad} exited non-zero:\n" + "\n".join(tail))
    first, last = table_span(dsn, args.n)
    shares = check_ledgers(work_dir, args.workers, args.n)
    print(f"\n{args.workers} workers x --procs 1, {args.n:,} jobs, each ran exactly once (ledgers): "
          f"{args.n / wall:,.0f} jobs/s wall ({wall:.1f} s), {args.n / (last - first):,.0f} jobs/s span "
          f"({last - first:.1f} s)  [load {os.getloadavg()[0]:.1f}]")
    print("| worker | jobs | share | connections held (most at once) |\n|---|---:|---:|---|")
    for k, (jobs, held) in enumerate(zip(shares, most, strict=True)):
        detail = ", ".join(f"{name} {c}" for name, c in sorted(held.items()))
        print(f"| fleet-{k} | {jobs:,} | {jobs / args.n:.1%} | {sum(held.values())} ({detail}) |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help="a scratch database (truncates shardworker.jobs); "
                                                    "default: a temporary embedded server")
    parser.add_argument("--part", choices=("fleet", "enqueue", "both"), default="both")
    parser.add_argument("--workers", type=int, default=8, help="workers in the fleet (default 8)")
    parser.add_argument("-n", type=int, default=200_000, help="queued jobs for the fleet (default 200,000)")
    parser.add_argument("--writers", type=int, default=16, help="enqueuing processes (default 16)")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each enqueue round (default 10)")
    parser.add_argument("--repeat", type=int, default=3, help="enqueue rounds of each variant (default 3)")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.n < 1 or args.writers < 1 or args.seconds <= 0 or args.repeat < 1:
        parser.error("--workers, -n, --writers, --repeat must be >= 1 and --seconds > 0")
    print(f"code: {code_version()}", flush=True)
    with database(args.dsn) as dsn:
        work_dir = tempfile.mkdtemp(prefix="sw-bench-fleet-")
        try:
            write_app(work_dir)
            if args.part in ("fleet", "both"):
                run_fleet(dsn, args, work_dir)
            if args.part in ("enqueue", "both"):
                compare_enqueue(dsn, args)
        finally:
            shutil.rmtree(work_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
