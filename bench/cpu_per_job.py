"""Where the CPU goes: CPU time per job of each process of the worker's tree and of PostgreSQL.

Issue 46's first measure: before changing anything for speed, how many microseconds of CPU each
process spends per no-op job at ``--procs 2``: the parent (claims, routing, pipes), each child
(running handlers, the group commit), the flusher (decoding, applying), and PostgreSQL's
backends (claims, applies, notifications) with its background processes. The worker is a real
``shardworker run --procs 2 --exit-when-idle`` on ``--jobs`` queued no-op jobs; its processes'
CPU comes from its own ``/metrics`` (``shardworker_process_cpu_seconds_total{role}``, read from
``/proc``), scraped every 100 ms until it exits (the last scrape is the total, give or take the
exit's last moments); PostgreSQL's from ``/proc``: its postmaster and every process it started,
counted before the launch and after the exit (a backend that exited is in the postmaster's
``cutime``). Linux only. Rounds repeat; the table gives medians.

Usage::

    python bench/cpu_per_job.py                    # embedded PostgreSQL, 100,000 jobs, 3 rounds
    python bench/cpu_per_job.py --jobs 20000 --repeat 5 --dsn postgresql://...
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psycopg
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_db import database, load_jobs
from throughput import APP_MODULE, write_app

TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def proc_cpu(pid: int, children: bool = False) -> float:
    """CPU seconds of ``pid`` (with ``children``: and of its waited-for children)."""
    fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12]) + ((int(fields[13]) + int(fields[14])) if children else 0)
    return ticks / TICKS


def postgres_cpu(postmaster: int) -> float:
    """The server's CPU so far: the postmaster with its exited children, and its live ones."""
    total = proc_cpu(postmaster, children=True)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int((entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[1]) == postmaster:
                total += proc_cpu(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return total


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        text = response.read().decode()
    return {s.labels["role"]: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "shardworker_process_cpu_seconds_total"}


def one_round(dsn: str, jobs: int, work_dir: str) -> tuple[dict[str, float], float]:
    """CPU seconds by process (the worker's roles, and "postgres"), and the run's wall seconds."""
    load_jobs(dsn, jobs, "bench_noop")
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        postmaster = int(Path(f"/proc/{row[0]}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
    time.sleep(0.5)  # the probe's backend gone
    pg_before = postgres_cpu(postmaster)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [work_dir, os.environ.get("PYTHONPATH")]))}
    env.pop("SHARDWORKER_DSN", None)
    started = time.monotonic()
    with Path(work_dir, "worker.log").open("ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "shardworker", "run", "--app", APP_MODULE, "--procs", "2",
                                 "--exit-when-idle", "--outbox-dir", tempfile.mkdtemp(dir=work_dir), "--dsn", dsn,
                                 "--metrics-port", str(port)], env=env, stdout=log, stderr=log, cwd=work_dir)
    last: dict[str, float] = {}
    while proc.poll() is None:
        with contextlib.suppress(OSError):  # not serving yet, or gone
            last = scrape(port) or last
        time.sleep(0.1)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"the worker exited {proc.returncode}: see {work_dir}/worker.log")
    time.sleep(0.5)  # the worker's backends exit and are reaped
    return {**last, "postgres": postgres_cpu(postmaster) - pg_before}, wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help="a scratch database (truncates shardworker.jobs); "
                                                    "default: a temporary embedded server")
    parser.add_argument("--jobs", type=int, default=100_000, help="no-op jobs a round (default 100,000)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    args = parser.parse_args(argv)
    rounds: list[dict[str, float]] = []
    walls: list[float] = []
    with database(args.dsn) as dsn, tempfile.TemporaryDirectory(prefix="sw-bench-cpu-") as work_dir:
        write_app(work_dir)
        for n in range(args.repeat):
            cpu, wall = one_round(dsn, args.jobs, work_dir)
            rounds.append(cpu)
            walls.append(wall)
            print(f"round {n + 1}: {args.jobs / wall:,.0f} jobs/s launch to exit; CPU s "
                  + ", ".join(f"{role} {s:.2f}" for role, s in sorted(cpu.items()))
                  + f"  [load {os.getloadavg()[0]:.1f}]", flush=True)
    roles = sorted({role for r in rounds for role in r}, key=lambda r: (r == "postgres", r))
    print(f"\nCPU per job, medians of {args.repeat} rounds of {args.jobs:,} no-op jobs on --procs 2 "
          f"({args.jobs / statistics.median(walls):,.0f} jobs/s launch to exit)\n")
    print("| process | CPU s | µs per job |\n|---|---:|---:|")
    total = 0.0
    for role in roles:
        seconds = statistics.median(r.get(role, 0.0) for r in rounds)
        total += seconds
        print(f"| {role} | {seconds:.2f} | {seconds / args.jobs * 1e6:.1f} |")
    print(f"| all | {total:.2f} | {total / args.jobs * 1e6:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
