"""How fast a worker starts and stops (issue 26, point 1): ``shardworker run`` launched with one
job queued, as a user runs it, median of N runs:

* launch -> first handler start (the job claimed, routed and started: at least the claim);
* last outcome applied (the job's ``finished_at``) -> process exit, with ``--exit-when-idle``;
* SIGTERM -> process exit, with nothing in flight (the job done first);

beside ``python -c pass`` and ``python -c "import psycopg"`` on the same machine.

    python bench/startup.py                   # a temporary embedded server; --procs 2 and 16, 5 runs
    python bench/startup.py --procs 2 --runs 9 --dsn postgresql://...

Targets: first claim <= 300 ms at --procs 2 and <= 500 ms at --procs 16; exit <= 150 ms.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import psycopg
from bench_db import database

APP = '''import os, time
from shardworker import App
app = App()


@app.handler("first")
def first(job):
    with open(os.environ["SW_BENCH_STARTED"], "a") as f:
        f.write(f"{time.time()}\\n")
'''


def wall(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - started


def enqueue_one(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM shardworker.jobs")
        conn.execute("DELETE FROM shardworker.workers")
        row = conn.execute("INSERT INTO shardworker.jobs (kind, payload) VALUES ('first', 'null') RETURNING id")
        return int(row.fetchone()[0])  # type: ignore[index]


def finished_at(dsn: str, job_id: int) -> float | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT extract(epoch FROM finished_at) FROM shardworker.jobs WHERE id = %s AND "
                           "status = 'done'", [job_id]).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def one_run(dsn: str, project: str, procs: int, sigterm: bool, pythonpath: str = "") -> tuple[float, float]:
    """(launch -> first handler start, applied -> exit or SIGTERM -> exit) in seconds."""
    job_id = enqueue_one(dsn)
    started_file = os.path.join(project, "started.txt")
    if os.path.exists(started_file):
        os.unlink(started_file)
    env = {**os.environ, "SW_BENCH_STARTED": started_file,
           "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, project) if p)}
    command = [sys.executable, "-m", "shardworker", "run", "--app", "startup_app", "--procs", str(procs),
               "--dsn", dsn, "--outbox-dir", os.path.join(project, "sw-outbox"), "--log-format", "text"]
    with open(os.path.join(project, "worker.log"), "a") as log:
        launched = time.time()
        worker = subprocess.Popen([*command, *([] if sigterm else ["--exit-when-idle"])], cwd=project, env=env,
                                  stdout=subprocess.DEVNULL, stderr=log)
    if sigterm:
        while finished_at(dsn, job_id) is None:
            time.sleep(0.01)
        time.sleep(0.5)  # idle: nothing in flight, the outbox drained
        asked = time.time()
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
        stop = time.time() - asked
    else:
        worker.wait(120)
        exited = time.time()  # before the query below: its connection is no part of the worker's exit
        applied = finished_at(dsn, job_id)
        assert applied is not None, "the job did not finish"
        stop = exited - applied
    with open(started_file) as f:
        first = float(f.read().split()[0])
    return first - launched, stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", help="a scratch database (default: a temporary embedded server)")
    parser.add_argument("--procs", type=int, action="append", help="repeatable (default: 2 and 16)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--pythonpath", default="", help="a shardworker tree to run instead (a before/after)")
    args = parser.parse_args()
    med = statistics.median
    base = [wall([sys.executable, "-c", "pass"]) for _ in range(args.runs)]
    pg = [wall([sys.executable, "-c", "import psycopg"]) for _ in range(args.runs)]
    print(f"python -c pass: {med(base) * 1000:.0f} ms; python -c 'import psycopg': {med(pg) * 1000:.0f} ms "
          f"(medians of {args.runs})")
    with database(args.dsn) as dsn, tempfile.TemporaryDirectory(prefix="sw-startup-") as project:
        with open(os.path.join(project, "startup_app.py"), "w") as f:
            f.write(APP)
        for procs in args.procs or [2, 16]:
            idle = [one_run(dsn, project, procs, False, args.pythonpath) for _ in range(args.runs)]
            term = [one_run(dsn, project, procs, True, args.pythonpath) for _ in range(args.runs)]
            print(f"--procs {procs}: launch -> first handler start {med(r[0] for r in idle) * 1000:.0f} ms "
                  f"(min {min(r[0] for r in idle) * 1000:.0f}, max {max(r[0] for r in idle) * 1000:.0f}); "
                  f"applied -> exit (--exit-when-idle) {med(r[1] for r in idle) * 1000:.0f} ms "
                  f"(min {min(r[1] for r in idle) * 1000:.0f}, max {max(r[1] for r in idle) * 1000:.0f}); "
                  f"SIGTERM -> exit, idle {med(r[1] for r in term) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
