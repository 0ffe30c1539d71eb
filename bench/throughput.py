"""Throughput of ``shardworker run`` on no-op jobs, against a plain psycopg loop.

For each ``--procs`` value: truncate ``shardworker.jobs``, enqueue N no-op jobs, time
``shardworker run --exit-when-idle`` as a real subprocess, check that all N jobs are
``done``, and report jobs/s two ways:

* **wall**: the subprocess from launch to exit (imports, spawning children and the
  flusher, startup recovery, the idle check and the shutdown included);
* **span**: from the first claim (``min(attempted_at)``) to the last applied outcome
  (``max(finished_at)``), read from the table: the steady-state rate without process
  startup and shutdown. Both clocks are this machine's when the server is local.

The baseline claims 500 jobs with ``FOR UPDATE SKIP LOCKED``, runs the no-op handler
in-process and marks the batch done with one ``UPDATE ... FROM unnest(...)``: the same
two commits per batch as the worker, without the outbox, its fsyncs or child processes.

The machine is usually shared: ``--repeat R`` interleaves R rounds and the final table
shows each run's median; every line also prints the load average. ``--pg-setting`` sets a
server parameter for the runs' sessions (e.g. ``plan_cache_mode=force_custom_plan``) to try
a what-if without touching the worker's code.

Usage::

    python bench/throughput.py                       # embedded PostgreSQL, N=50000, P=1,2,4
    python bench/throughput.py -n 20000 --procs 2 --repeat 3 --dsn postgresql://...
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import plain_loop  # bench/plain_loop.py: the script's directory is on sys.path
from bench_db import database, database_settings, load_jobs, table_span

KIND = "bench_noop"
APP_MODULE = "bench_noop_app"
TARGET_JOBS_PER_S = 10_000
# --kind: what the handler does. noop and cpu are sync (one at a time per child); async and
# threads wait --sleep-ms on the event loop or in a pool thread (up to --concurrency per child).
KINDS = {"noop": KIND, "cpu": "bench_cpu", "async": "bench_async", "threads": "bench_threads"}


@dataclass(frozen=True)
class Result:
    """One measured run."""

    name: str
    jobs: int
    wall_s: float
    span_s: float | None = None  # first claim to last finish, from the table
    startup_s: float | None = None  # launch to first claim
    shutdown_s: float | None = None  # last finish to exit

    @property
    def wall_rate(self) -> float:
        return self.jobs / self.wall_s

    @property
    def span_rate(self) -> float | None:
        return self.jobs / self.span_s if self.span_s else None


# --- the worker -------------------------------------------------------------------


def write_app(directory: str) -> None:
    """Copy the bench's app module (``bench/bench_noop_app.py``) into ``directory`` (put it on PYTHONPATH)."""
    shutil.copy(Path(__file__).with_name(f"{APP_MODULE}.py"), Path(directory, f"{APP_MODULE}.py"))


def worker_command(dsn: str, procs: int, outbox_dir: str, extra: tuple[str, ...] = ()) -> list[str]:
    """``shardworker run ...``: the installed script, else ``python -m shardworker``."""
    exe = shutil.which("shardworker")
    base = [exe] if exe else [sys.executable, "-m", "shardworker"]
    return [*base, "run", "--app", APP_MODULE, "--procs", str(procs), "--exit-when-idle",
            "--outbox-dir", outbox_dir, "--dsn", dsn, *extra]


def time_worker(dsn: str, app_dir: str, procs: int, log_path: Path,
                extra: tuple[str, ...] = ()) -> tuple[float, float, float]:
    """Run one ``shardworker run --exit-when-idle`` to its end, on a fresh outbox directory:
    (wall seconds, launched, exited), the last two as epoch seconds."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [app_dir, os.environ.get("PYTHONPATH")]))}
    env.pop("SHARDWORKER_DSN", None)
    outbox_dir = tempfile.mkdtemp(prefix="sw-bench-outbox-")
    try:
        with log_path.open("wb") as log:
            launched, t0 = time.time(), time.perf_counter()
            rc = subprocess.run(worker_command(dsn, procs, outbox_dir, extra), env=env, stdout=log,
                                stderr=log).returncode
            wall, exited = time.perf_counter() - t0, time.time()
    finally:
        shutil.rmtree(outbox_dir, ignore_errors=True)
    if rc != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(f"shardworker run --procs {procs} exited {rc}; last log lines:\n" + "\n".join(tail))
    return wall, launched, exited


def run_worker(dsn: str, app_dir: str, procs: int, n: int, log_path: Path, extra: tuple[str, ...] = (),
               name: str = "") -> Result:
    """Time one ``shardworker run --exit-when-idle`` over ``n`` queued jobs."""
    wall, launched, exited = time_worker(dsn, app_dir, procs, log_path, extra)
    first, last = table_span(dsn, n)
    return Result(name or f"shardworker P={procs}", n, wall, last - first, first - launched, exited - last)


# --- the baseline -----------------------------------------------------------------


def run_plain_loop(dsn: str, n: int, batch: int) -> Result:
    """The plain psycopg loop (``bench/plain_loop.py``) over the ``n`` queued jobs."""
    wall = plain_loop.run(dsn, KIND, batch)
    first, last = table_span(dsn, n)
    return Result(f"plain psycopg loop (batch {batch})", n, wall, last - first)


# --- reporting ----------------------------------------------------------------------


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_result(result: Result) -> None:
    line = (f"{result.name}: {result.jobs} jobs, wall {result.wall_s:.2f}s = {result.wall_rate:,.0f} jobs/s; "
            f"span {fmt(result.span_s, '.2f')}s = {fmt(result.span_rate, ',.0f')} jobs/s")
    if result.startup_s is not None:
        line += f" (startup {result.startup_s:.2f}s, shutdown {fmt(result.shutdown_s, '.2f')}s)"
    print(f"{line}  [load {os.getloadavg()[0]:.1f}]", flush=True)


def medians(results: list[Result]) -> list[Result]:
    """One row per run name: the run with the median span rate (wall rate for ties)."""
    by_name: dict[str, list[Result]] = {}
    for r in results:
        by_name.setdefault(r.name, []).append(r)
    return [sorted(rs, key=lambda r: (r.span_rate or 0, r.wall_rate))[len(rs) // 2] for rs in by_name.values()]


def print_table(results: list[Result], repeats: int) -> None:
    """The final table (median of the repeats), then each shardworker run against the baseline."""
    header = f"{'run':<32} {'jobs':>7} " + " ".join(f"{h:>7}" for h in ("wall s", "jobs/s", "span s", "jobs/s",
                                                                      "start s", "stop s"))
    title = f"median of {repeats} rounds (upper median for an even count)" if repeats > 1 else "results"
    print(f"\n{title} (wall: launch to exit; span: first claim to last finish, from the table)")
    print(header + "\n" + "-" * len(header))
    rows = medians(results)
    for r in rows:
        print(f"{r.name:<32} {r.jobs:>7} {r.wall_s:>7.2f} {r.wall_rate:>7,.0f} {fmt(r.span_s, '.2f'):>7} "
              f"{fmt(r.span_rate, ',.0f'):>7} {fmt(r.startup_s, '.2f'):>7} {fmt(r.shutdown_s, '.2f'):>7}")
    plain = next((r for r in rows if r.name.startswith("plain")), None)
    for r in rows:
        if plain is not None and r is not plain:
            span_ratio = r.span_rate / plain.span_rate if r.span_rate and plain.span_rate else None
            print(f"{r.name} / plain: wall {r.wall_rate / plain.wall_rate:.2f}, span {fmt(span_ratio, '.2f')}")
    p2 = next((r for r in rows if r.name == "shardworker P=2"), None)
    if p2 is not None:
        verdict = "meets" if (p2.span_rate or 0) >= TARGET_JOBS_PER_S else "misses"
        print(f"target >= {TARGET_JOBS_PER_S:,} jobs/s at --procs 2: span rate {fmt(p2.span_rate, ',.0f')} "
              f"{verdict} it (wall rate {p2.wall_rate:,.0f})")


def code_version() -> str:
    """The repository's HEAD, marked dirty when the measured code has uncommitted changes."""
    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", "shardworker", "outbox",
                                "migrations"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{head}{' + uncommitted changes' if dirty else ''}"


# --- main ----------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None,
                        help="a scratch PostgreSQL database: the bench truncates shardworker.jobs "
                             "(default: a temporary embedded server)")
    parser.add_argument("-n", "--jobs", type=int, default=50_000, help="jobs per run (default 50000)")
    parser.add_argument("--procs", default="1,2,4", help="comma-separated --procs values (default 1,2,4)")
    parser.add_argument("--batch", type=int, default=500, help="the baseline's claim batch (default 500)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds, interleaved; the table shows medians")
    parser.add_argument("--no-baseline", action="store_true", help="skip the plain psycopg loop")
    parser.add_argument("--kind", choices=sorted(KINDS), default="noop",
                        help="what the handler does: noop, cpu (2000 sha256 rounds), async (awaits --sleep-ms), "
                             "threads (sleeps --sleep-ms in a pool thread); default noop")
    parser.add_argument("--sleep-ms", type=float, default=20.0, help="the async/threads handlers' wait (default 20)")
    parser.add_argument("--concurrency", type=int, default=None, help="shardworker run --concurrency")
    parser.add_argument("--worker-arg", action="append", default=[], metavar="ARG",
                        help="one more argument for shardworker run (repeatable), e.g. --worker-arg=--prefetch=500")
    parser.add_argument("--pg-setting", action="append", default=[], metavar="NAME=VALUE",
                        help="ALTER DATABASE ... SET for the runs (reset afterwards), e.g. "
                             "plan_cache_mode=force_custom_plan; repeatable")
    args = parser.parse_args(argv)
    args.procs = [int(p) for p in args.procs.split(",") if p.strip()]
    args.pg_setting = [tuple(s.split("=", 1)) for s in args.pg_setting]
    if any(len(s) != 2 for s in args.pg_setting):
        parser.error("--pg-setting takes NAME=VALUE")
    return args


def run_round(dsn: str, args: argparse.Namespace, work_dir: str, results: list[Result]) -> None:
    """The baseline (no-op jobs only), then one worker run per ``--procs`` value, each on a fresh table."""
    kind = KINDS[args.kind]
    if not args.no_baseline and args.kind == "noop":
        load_jobs(dsn, args.jobs, KIND)
        results.append(run_plain_loop(dsn, args.jobs, args.batch))
        print_result(results[-1])
    extra = (("--concurrency", str(args.concurrency)) if args.concurrency else ()) + tuple(args.worker_arg)
    for procs in args.procs:
        load_jobs(dsn, args.jobs, kind)
        name = f"shardworker P={procs}" + (f" {args.kind}" if args.kind != "noop" else "")
        name += f" C={args.concurrency}" if args.concurrency else ""
        results.append(run_worker(dsn, work_dir, procs, args.jobs, Path(work_dir, f"worker-p{procs}.log"), extra,
                                  name))
        print_result(results[-1])
        if args.kind in ("async", "threads"):
            ideal = procs * (args.concurrency or 10) / (args.sleep_ms / 1000)
            print(f"  ideal for {args.kind}: {procs} procs x {args.concurrency or 10} in flight / "
                  f"{args.sleep_ms:g} ms = {ideal:,.0f} jobs/s", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"shardworker {code_version()}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"N={args.jobs}, --procs {','.join(map(str, args.procs))}", flush=True)
    work_dir = tempfile.mkdtemp(prefix="sw-bench-")
    write_app(work_dir)
    os.environ["BENCH_SLEEP_MS"] = str(args.sleep_ms)
    results: list[Result] = []
    try:
        with database(args.dsn) as dsn, database_settings(dsn, args.pg_setting):
            for _ in range(args.repeat):
                run_round(dsn, args, work_dir, results)
        print_table(results, args.repeat)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
