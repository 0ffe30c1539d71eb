"""I/O-bound jobs at the ceiling: shardworker against pgqueuer on the same server, same sitting.

Each round, on a fresh table each time, ``-n`` jobs (default 10,000) of a handler waiting
``--sleep-ms`` (default 20):

* shardworker, ``async def`` awaiting it (``bench_async``), ``run --procs P --concurrency C
  --exit-when-idle``;
* shardworker, a ``threads=True`` handler sleeping it (``bench_threads``), the same flags;
* pgqueuer (``pip install -e '.[bench]'``), its consumer run as its docs run one: ``pgq run
  bench_pgq_app:main --mode drain --max-concurrent-tasks C --batch-size C/2`` (asyncpg,
  uvloop; ``bench/bench_pgq_app.py`` calls that command's function, see there why), in 1 and
  in 2 processes started together.

``--before DIR`` adds shardworker's two runs from another checkout to every round, and the
ratios of this one to it. shardworker's children run ``async def`` handlers on uvloop too when it is installed (the
``bench`` extra installs it).

Each run prints *wall* (launch to the last process's exit) and *span* (first claim to last
finish, from the table: shardworker's ``attempted_at`` and ``finished_at``, pgqueuer's
``pgqueuer_log`` rows ``picked`` and ``successful``). The table shows each run's median of
``--repeat`` interleaved rounds, then ratios taken within each round (median and range):
threaded against async, and shardworker's async wall rate against pgqueuer's 2-process wall
rate. Targets (issue 26): span >= 9,000 and wall >= 6,000 jobs/s, threaded >= 0.7 of async,
and shardworker's wall >= 1.5x pgqueuer's 2-process rate.

Usage::

    python bench/iobound.py                      # embedded PostgreSQL, 3 rounds
    python bench/iobound.py --repeat 5 --dsn postgresql://...   # a scratch database
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import asyncpg
from bench_db import database, load_jobs
from pgqueuer.db import AsyncpgDriver
from pgqueuer.queries import Queries
from throughput import Result, code_version, medians, print_result, run_worker, write_app

PGQ_APP = "bench_pgq_app"
TARGETS = {"span": 9_000, "wall": 6_000, "threads/async": 0.7, "wall / pgqueuer P=2": 1.5}


# --- pgqueuer ---------------------------------------------------------------------------


async def pgq_reset(dsn: str, n: int, entrypoint: str) -> None:
    """Install pgqueuer's schema once, empty its queue and log, and enqueue ``n`` jobs."""
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        if not await queries.schema_is_installed():
            await queries.install()
        await conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
        for start in range(0, n, 1_000):
            size = min(1_000, n - start)
            await queries.enqueue([entrypoint] * size, [None] * size, [0] * size)
        await conn.execute("ANALYZE pgqueuer")
    finally:
        await conn.close()


async def pgq_span(dsn: str, n: int) -> tuple[float, float]:
    """Check that pgqueuer finished all ``n`` jobs; (first pick, last success) as epoch seconds."""
    conn = await asyncpg.connect(dsn)
    try:
        left = await conn.fetchval("SELECT count(*) FROM pgqueuer")
        done = await conn.fetchval("SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'")
        if left or done != n:
            raise RuntimeError(f"pgqueuer: {left} jobs left in the queue, {done} successful, expected {n}")
        row = await conn.fetchrow(
            "SELECT extract(epoch FROM min(created) FILTER (WHERE status = 'picked'))::float8 AS first, "
            "extract(epoch FROM max(created) FILTER (WHERE status = 'successful'))::float8 AS last "
            "FROM pgqueuer_log")
    finally:
        await conn.close()
    return row["first"], row["last"]


def run_pgqueuer(dsn: str, app_dir: str, procs: int, n: int, concurrency: int, log_dir: str) -> Result:
    """``procs`` pgqueuer consumers started together, each ``--mode drain``, to the last one's exit."""
    asyncio.run(pgq_reset(dsn, n, "bench_async"))
    # batch size, tasks: pgqueuer wants at least twice the batch in tasks
    cmd = [sys.executable, "-m", PGQ_APP, str(max(1, concurrency // 2)), str(concurrency)]
    env = {**os.environ, "BENCH_DSN": dsn,
           "PYTHONPATH": os.pathsep.join(filter(None, [app_dir, os.environ.get("PYTHONPATH")]))}
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(Path(log_dir, f"pgq-p{procs}-{i}.log").open("wb")) for i in range(procs)]
        launched, t0 = time.time(), time.perf_counter()
        consumers = [subprocess.Popen(cmd, env=env, stdout=log, stderr=log) for log in logs]
        codes = [c.wait() for c in consumers]
        wall, exited = time.perf_counter() - t0, time.time()
    if any(codes):
        tail = Path(log_dir, f"pgq-p{procs}-0.log").read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(f"pgq run exited {codes}; the first one's last log lines:\n" + "\n".join(tail))
    first, last = asyncio.run(pgq_span(dsn, n))
    return Result(f"pgqueuer P={procs}", n, wall, last - first, first - launched, exited - last)


# --- shardworker ------------------------------------------------------------------------


def run_shardworker(dsn: str, args: argparse.Namespace, kind: str, work_dir: str, before: bool = False) -> Result:
    """One ``shardworker run --exit-when-idle`` over ``-n`` fresh jobs of ``bench_<kind>``; with
    ``before``, the worker runs from the ``--before`` checkout (first on its PYTHONPATH)."""
    load_jobs(dsn, args.jobs, f"bench_{kind}")
    extra = ("--concurrency", str(args.concurrency), *args.worker_arg)
    name = f"shardworker P={args.procs} {kind}" + (" [before]" if before else "")
    saved = os.environ.get("PYTHONPATH")
    if before:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [args.before, saved]))
    try:
        return run_worker(dsn, work_dir, args.procs, args.jobs, Path(work_dir, f"worker-{kind}.log"), extra, name)
    finally:
        if before and saved is None:
            del os.environ["PYTHONPATH"]
        elif before:
            os.environ["PYTHONPATH"] = saved


# --- reporting ----------------------------------------------------------------------------


def round_ratios(batch: dict[str, Result], procs: int) -> dict[str, float]:
    """This round's ratios: threaded over async (span and wall), async wall over pgqueuer's."""
    a, t = batch[f"shardworker P={procs} async"], batch[f"shardworker P={procs} threads"]
    ratios = {"threads/async span": (t.span_rate or 0) / (a.span_rate or 1),
              "threads/async wall": t.wall_rate / a.wall_rate}
    if "pgqueuer P=2" in batch:
        ratios["wall / pgqueuer P=2"] = a.wall_rate / batch["pgqueuer P=2"].wall_rate
        ratios["span / pgqueuer P=2 span"] = (a.span_rate or 0) / (batch["pgqueuer P=2"].span_rate or 1)
    for kind in ("async", "threads"):
        if (b := batch.get(f"shardworker P={procs} {kind} [before]")) is not None:
            now = batch[f"shardworker P={procs} {kind}"]
            ratios[f"{kind} wall / before"] = now.wall_rate / b.wall_rate
            ratios[f"{kind} span / before"] = (now.span_rate or 0) / (b.span_rate or 1)
    return ratios


def print_table(results: list[Result], ratios: list[dict[str, float]], procs: int, repeats: int) -> None:
    """Medians per run, the ratios per round, and each target met or missed."""
    print(f"\nmedian of {repeats} rounds (wall: launch to exit; span: first claim to last finish)")
    header = f"{'run':<28} {'jobs':>6} {'wall s':>7} {'jobs/s':>7} {'span s':>7} {'jobs/s':>7} {'start s':>7} " \
             f"{'stop s':>7}"
    print(header + "\n" + "-" * len(header))
    rows = {r.name: r for r in medians(results)}
    for r in rows.values():
        print(f"{r.name:<28} {r.jobs:>6} {r.wall_s:>7.2f} {r.wall_rate:>7,.0f} {r.span_s or 0:>7.2f} "
              f"{r.span_rate or 0:>7,.0f} {r.startup_s or 0:>7.2f} {r.shutdown_s or 0:>7.2f}")
    print("\nratios within each round: median (min-max)")
    for key in ratios[0]:
        values = [r[key] for r in ratios]
        print(f"  {key:<26} {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
    async_row = rows[f"shardworker P={procs} async"]
    checks = [("span", async_row.span_rate or 0, TARGETS["span"]), ("wall", async_row.wall_rate, TARGETS["wall"]),
              ("threads/async", statistics.median(min(r["threads/async span"], r["threads/async wall"])
                                                  for r in ratios), TARGETS["threads/async"])]
    if "wall / pgqueuer P=2" in ratios[0]:
        checks.append(("wall / pgqueuer P=2", statistics.median(r["wall / pgqueuer P=2"] for r in ratios),
                       TARGETS["wall / pgqueuer P=2"]))
    for name, value, target in checks:
        print(f"target {name} >= {target:,}: {value:,.2f} {'meets' if value >= target else 'misses'} it")


# --- main -----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help="a scratch database: the bench truncates shardworker.jobs and "
                                                    "pgqueuer's tables (default: a temporary embedded server)")
    parser.add_argument("-n", "--jobs", type=int, default=10_000, help="jobs per run (default 10000)")
    parser.add_argument("--procs", type=int, default=2, help="shardworker run --procs (default 2)")
    parser.add_argument("--concurrency", type=int, default=100,
                        help="in flight per process: shardworker --concurrency, pgqueuer --max-concurrent-tasks "
                             "(and half of it as --batch-size) (default 100)")
    parser.add_argument("--sleep-ms", type=float, default=20.0, help="each handler's wait (default 20)")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds; the table shows medians")
    parser.add_argument("--no-pgqueuer", action="store_true", help="shardworker's runs only")
    parser.add_argument("--before", metavar="DIR", default=None,
                        help="also run shardworker from this checkout (e.g. `git archive <commit> shardworker "
                             "outbox | tar -x -C DIR`), in the same rounds, for a before/after")
    parser.add_argument("--worker-arg", action="append", default=[], metavar="ARG",
                        help="one more argument for shardworker run (repeatable)")
    return parser.parse_args(argv)


def run_round(dsn: str, args: argparse.Namespace, work_dir: str) -> dict[str, Result]:
    """shardworker async and threaded, then pgqueuer in 1 and 2 processes; each printed as it ends."""
    batch: dict[str, Result] = {}
    runs = [lambda kind=kind: run_shardworker(dsn, args, kind, work_dir) for kind in ("async", "threads")]
    if args.before:
        runs += [lambda kind=kind: run_shardworker(dsn, args, kind, work_dir, before=True)
                 for kind in ("async", "threads")]
    if not args.no_pgqueuer:
        runs += [lambda p=p: run_pgqueuer(dsn, work_dir, p, args.jobs, args.concurrency, work_dir) for p in (1, 2)]
    for run in runs:
        result = run()
        batch[result.name] = result
        print_result(result)
    return batch


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"shardworker {code_version()}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"N={args.jobs}, --procs {args.procs}, concurrency {args.concurrency}, {args.sleep_ms:g} ms each; "
          f"ideal {args.procs * args.concurrency / (args.sleep_ms / 1000):,.0f} jobs/s", flush=True)
    work_dir = tempfile.mkdtemp(prefix="sw-bench-io-")
    write_app(work_dir)
    shutil.copy(Path(__file__).with_name(f"{PGQ_APP}.py"), Path(work_dir, f"{PGQ_APP}.py"))
    os.environ["BENCH_SLEEP_MS"] = str(args.sleep_ms)
    results: list[Result] = []
    ratios: list[dict[str, float]] = []
    try:
        with database(args.dsn) as dsn:
            for _ in range(args.repeat):
                batch = run_round(dsn, args, work_dir)
                results += batch.values()
                ratios.append(round_ratios(batch, args.procs))
        print_table(results, ratios, args.procs, args.repeat)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
