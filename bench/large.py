"""Big results and big payloads: MB/s and peak memory of ``shardworker run``.

Two workloads, each ``-n`` jobs (default 200) of ``--mib`` MiB (default 5):

* **results**: a tiny payload; the handler returns a string of ``--mib`` MiB (JSON text),
  which goes child -> outbox -> flusher -> ``jobs.result``;
* **payloads**: a payload holding a string of ``--mib`` MiB; the handler returns its
  length, so the bytes go ``jobs.payload`` -> claim -> parent -> pipe -> child.

For each it times a real ``shardworker run --procs P --exit-when-idle`` and samples the
resident memory of every process of its tree (``/proc``, every 20 ms), printing the peak
of each role (parent, children, flusher) and of the whole tree at one instant. Beside it,
in the same run, a plain psycopg loop moves the same bytes: for results it claims one job
at a time and writes a result of the same size with ``UPDATE ... SET result = %s::jsonb``;
for payloads it claims one job at a time reading the payload and marks it done. MB/s is
the workload's bytes (N x MiB) over the wall time. Targets: tree peak under 512 MiB and at
least half the plain loop's MB/s.

Usage::

    python bench/large.py                          # embedded PostgreSQL, 200 x 5 MiB, --procs 2
    python bench/large.py -n 50 --mib 10 --mode results --dsn postgresql://...
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import code_version, database

from shardworker.client import JobSpec, enqueue_many

APP_MODULE = "bench_large_app"
TARGET_TREE_MIB = 512
APP_SOURCE = '''
    """Handlers for bench/large.py."""
    import base64
    import os

    from shardworker import App

    app = App()
    _BLOB = {}


    def blob(mib):
        # Random-looking text (incompressible, like extracted documents or embeddings).
        if mib not in _BLOB:
            _BLOB[mib] = base64.b64encode(os.urandom(mib * 1024 * 1024 * 3 // 4)).decode()
        return _BLOB[mib]


    @app.handler("big_result")
    def big_result(job):
        return blob(job.payload["mib"])


    @app.handler("big_payload")
    def big_payload(job):
        return {"chars": len(job.payload["blob"])}
'''


def blob(mib: int) -> str:
    return base64.b64encode(os.urandom(mib * 1024 * 1024 * 3 // 4)).decode()


# --- memory -----------------------------------------------------------------------


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _name(pid: int) -> str:
    """The role a worker process shows in /proc/PID/comm (sw-flusher, sw-shard-0, ...)."""
    try:
        with open(f"/proc/{pid}/comm", encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return "?"


@dataclass
class Peaks:
    roles: dict[str, int] = field(default_factory=dict)  # peak KiB per process (by role + pid)
    tree: int = 0  # peak KiB of the whole tree at one sample


class TreeSampler(threading.Thread):
    """Samples the RSS of a process and all its descendants until stopped."""

    def __init__(self, root: int, interval_s: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.root, self.interval_s = root, interval_s
        self.peaks = Peaks()
        self.names: dict[int, str] = {}
        self._by_pid: dict[int, int] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            pids, todo = [], [self.root]
            while todo:
                pid = todo.pop()
                pids.append(pid)
                todo.extend(_children(pid))
            total = 0
            for pid in pids:
                rss = _rss_kib(pid)
                total += rss
                if not self.names.get(pid, "").startswith(("sw-", "parent")):
                    self.names[pid] = "parent" if pid == self.root else _name(pid)  # renamed once started
                self._by_pid[pid] = max(self._by_pid.get(pid, 0), rss)
            self.peaks.tree = max(self.peaks.tree, total)
            self._halt.wait(self.interval_s)

    def stop(self) -> Peaks:
        self._halt.set()
        self.join()
        self.peaks.roles = {f"{self.names.get(pid, '?')} {pid}": kib for pid, kib in self._by_pid.items()}
        return self.peaks


# --- workloads ----------------------------------------------------------------------


def load(dsn: str, mode: str, n: int, mib: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE shardworker.jobs CASCADE")  # and job_steps, job_dependencies
        if mode == "results":
            specs = (JobSpec("big_result", {"mib": mib}) for _ in range(n))
        else:
            text = blob(mib)  # the same bytes for each job; TOAST stores each row's copy
            specs = (JobSpec("big_payload", {"blob": text}) for _ in range(n))
        if None in enqueue_many(conn, specs):
            raise RuntimeError("enqueue_many enqueued fewer jobs than asked")
        conn.execute("ANALYZE shardworker.jobs")


def check_done(dsn: str, n: int, mode: str, mib: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        counts = dict(conn.execute("SELECT status, count(*) FROM shardworker.jobs GROUP BY status").fetchall())
        if counts != {"done": n}:
            raise RuntimeError(f"expected {n} done jobs, found {counts}")
        if mode == "results":
            row = conn.execute("SELECT min(octet_length(result::text)) FROM shardworker.jobs").fetchone()
            if row is None or row[0] < mib * 1024 * 1024:
                raise RuntimeError(f"a result is shorter than {mib} MiB: {row}")


def run_worker(dsn: str, app_dir: str, procs: int, log_path: Path, extra: list[str]) -> tuple[float, Peaks, dict]:
    exe = shutil.which("shardworker")
    base = [exe] if exe else [sys.executable, "-m", "shardworker"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [app_dir, os.environ.get("PYTHONPATH")]))}
    env.pop("SHARDWORKER_DSN", None)
    outbox_dir = tempfile.mkdtemp(prefix="sw-bench-outbox-")
    try:
        with log_path.open("wb") as log:
            t0 = time.perf_counter()
            proc = subprocess.Popen([*base, "run", "--app", APP_MODULE, "--procs", str(procs), "--exit-when-idle",
                                     "--outbox-dir", outbox_dir, "--dsn", dsn, *extra], env=env, stdout=log,
                                    stderr=log)
            sampler = TreeSampler(proc.pid)
            sampler.start()
            rc = proc.wait()
            wall = time.perf_counter() - t0
            peaks = sampler.stop()
    finally:
        shutil.rmtree(outbox_dir, ignore_errors=True)
    if rc != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(f"shardworker run exited {rc}; last log lines:\n" + "\n".join(tail))
    return wall, peaks, sampler.names


CLAIM_ONE = """
UPDATE shardworker.jobs SET status = 'running', attempt = attempt + 1, attempted_at = now()
WHERE id = (SELECT id FROM shardworker.jobs WHERE status = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id, {payload}
"""


def run_plain_loop(dsn: str, mode: str, mib: int) -> float:
    """One job at a time: claim, (compute), write the outcome; seconds for all."""
    result = orjson.dumps(blob(mib)).decode() if mode == "results" else None
    t0 = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
        while True:
            row = conn.execute(CLAIM_ONE.format(payload="payload::text" if mode == "payloads" else "1")).fetchone()
            if row is None:
                break
            value = result or orjson.dumps({"chars": len(orjson.loads(row[1])["blob"])}).decode()
            conn.execute("UPDATE shardworker.jobs SET status = 'done', result = %s::jsonb, finished_at = now() "
                         "WHERE id = %s", (value, row[0]))
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help="a scratch database (truncates shardworker.jobs); "
                                                    "default: a temporary embedded PostgreSQL")
    parser.add_argument("-n", "--jobs", type=int, default=200, help="jobs per workload (default 200)")
    parser.add_argument("--mib", type=int, default=5, help="MiB per result or payload (default 5)")
    parser.add_argument("--procs", type=int, default=2, help="shardworker run --procs (default 2)")
    parser.add_argument("--mode", choices=["results", "payloads", "both"], default="both")
    parser.add_argument("--no-baseline", action="store_true", help="skip the plain psycopg loop")
    parser.add_argument("--worker-arg", action="append", default=[], help="an option for shardworker run")
    args = parser.parse_args(argv)
    modes = ["results", "payloads"] if args.mode == "both" else [args.mode]
    total_mb = args.jobs * args.mib * 1.048576
    print(f"shardworker {code_version()}; {os.cpu_count()} CPUs; {args.jobs} jobs x {args.mib} MiB, "
          f"--procs {args.procs}", flush=True)
    work_dir = tempfile.mkdtemp(prefix="sw-bench-large-")
    Path(work_dir, f"{APP_MODULE}.py").write_text(textwrap.dedent(APP_SOURCE).lstrip(), encoding="utf-8")
    ok = True
    try:
        with database(args.dsn) as dsn:
            for mode in modes:
                load(dsn, mode, args.jobs, args.mib)
                wall, peaks, _ = run_worker(dsn, work_dir, args.procs, Path(work_dir, "worker.log"), args.worker_arg)
                check_done(dsn, args.jobs, mode, args.mib)
                rate = total_mb / wall
                line = f"{mode:9} shardworker: {wall:6.2f} s  {rate:7.1f} MB/s  tree peak {peaks.tree / 1024:6.0f} MiB"
                if not args.no_baseline:
                    load(dsn, mode, args.jobs, args.mib)
                    plain = total_mb / run_plain_loop(dsn, mode, args.mib)
                    line += f"   plain loop {plain:7.1f} MB/s  ratio {rate / plain:.2f}"
                    ok &= rate >= plain / 2
                print(line, flush=True)
                for name, kib in sorted(peaks.roles.items()):
                    print(f"    peak RSS {name:16} {kib / 1024:6.0f} MiB")
                ok &= peaks.tree / 1024 < TARGET_TREE_MIB
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    print(f"targets (tree peak < {TARGET_TREE_MIB} MiB, >= 0.5 x plain loop MB/s): {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
