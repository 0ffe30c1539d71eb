"""What a worker holds in memory: ``shardworker run --procs N`` (a real subprocess), its whole
process tree's RSS and PSS idle after startup, then again idle after ``--jobs`` no-op jobs.

RSS counts a page shared by the forked children and the parent once per process; PSS
(``/proc/PID/smaps_rollup``) splits each shared page among the processes that map it, so the
tree's PSS is what the tree really costs the machine. Each process is printed by role (the
parent, ``sw-shard-N``, ``sw-flusher``: each names itself), then the tree's sums; the jobs are
enqueued in chunks while the worker runs (``enqueue_many``), and the tree's peak RSS while
they run is sampled every 0.5 s.

    python bench/memory.py                        # a temporary embedded server, --procs 2, 1,000,000 jobs
    python bench/memory.py --jobs 100000 --dsn postgresql://...   # a scratch database: truncates the jobs

Target (issue 26 point 5): the tree under 150 MB RSS idle after startup at --procs 2, and flat
over 1M jobs.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time

import psycopg
from bench_db import database
from idle import role, start_worker

from shardworker import JobSpec, enqueue_many

APP = "from shardworker import App\napp = App()\n\n\n@app.handler('noop')\ndef noop(job):\n    return None\n"
TARGET_MB = 150
CHUNK = 50_000  # jobs per enqueue_many


def tree(pgid: int) -> dict[int, tuple[str, int, int]]:
    """Role, RSS and PSS (bytes) of every live process in group ``pgid``."""
    found: dict[int, tuple[str, int, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[2]) != pgid:
                    continue
            with open(f"/proc/{name}/comm") as f:
                command = f.read().strip()
            with open(f"/proc/{name}/smaps_rollup") as f:
                fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.endswith("kB\n")}
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        found[int(name)] = (role(command), fields.get("Rss", 0), fields.get("Pss", 0))
    return found


def report(label: str, processes: dict[int, tuple[str, int, int]]) -> tuple[float, float]:
    """Print each process and the tree's sums; returns (RSS MB, PSS MB)."""
    print(f"{label}:")
    for pid, (name, rss, pss) in sorted(processes.items()):
        print(f"  pid {pid:>7}  {name:<16}  RSS {rss / 1e6:6.1f} MB  PSS {pss / 1e6:6.1f} MB")
    rss_mb = sum(p[1] for p in processes.values()) / 1e6
    pss_mb = sum(p[2] for p in processes.values()) / 1e6
    print(f"  tree: {len(processes)} processes, RSS {rss_mb:.1f} MB, PSS {pss_mb:.1f} MB", flush=True)
    return rss_mb, pss_mb


def run_jobs(dsn: str, jobs: int, pgid: int, timeout_s: float) -> float:
    """Enqueue ``jobs`` no-op jobs in chunks and wait until all are done; the tree's peak RSS (MB)."""
    peak = 0.0
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(dsn, autocommit=True) as conn:
        sent = 0
        while True:
            if sent < jobs:
                count = min(CHUNK, jobs - sent)
                sent += len(enqueue_many(conn, (JobSpec("noop") for _ in range(count))))
            peak = max(peak, sum(p[1] for p in tree(pgid).values()) / 1e6)
            row = conn.execute("SELECT count(*) FROM shardworker.jobs WHERE status <> 'done'").fetchone()
            if sent >= jobs and row is not None and row[0] == 0:
                return peak
            if time.monotonic() > deadline:
                raise RuntimeError(f"jobs not done after {timeout_s:.0f}s")
            time.sleep(0.5 if sent >= jobs or (row is not None and row[0] > CHUNK) else 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", help="a scratch database (truncates shardworker.jobs; default: an embedded server)")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=1_000_000, help="no-op jobs to run (default 1,000,000)")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds idle before each measurement")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds the jobs may take")
    args = parser.parse_args()
    with database(args.dsn) as dsn, tempfile.TemporaryDirectory(prefix="sw-memory-") as project:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("TRUNCATE shardworker.jobs CASCADE")
        worker = start_worker(project, "memory_app", APP, dsn, args.procs)
        try:
            time.sleep(args.settle)
            idle_rss, idle_pss = report(f"idle after startup, --procs {args.procs}", tree(worker.pid))
            started = time.monotonic()
            peak = run_jobs(dsn, args.jobs, worker.pid, args.timeout)
            elapsed = time.monotonic() - started
            time.sleep(args.settle)
            rss, pss = report(f"idle after {args.jobs:,} jobs ({elapsed:.0f} s; peak RSS while running {peak:.1f} MB)",
                              tree(worker.pid))
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(60)
    verdict = "meets" if idle_rss <= TARGET_MB else "misses"
    print(f"idle tree RSS {idle_rss:.1f} MB (PSS {idle_pss:.1f}): {verdict} the <= {TARGET_MB} MB target; "
          f"after {args.jobs:,} jobs RSS {rss:.1f} MB (PSS {pss:.1f}): {rss - idle_rss:+.1f} MB")


if __name__ == "__main__":
    main()
