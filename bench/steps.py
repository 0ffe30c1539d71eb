"""Steps against outcomes: what a durable step (``job.step``) costs beside a job's outcome.

For each handler shape (``--shapes``, default sync, async, threads; async and threads at
each ``--concurrency``, default 10 and 50), in the same run: ``-n`` jobs (default 3000) of
10 no-op steps each, and 10 x N no-op jobs of the same shape, each through a real
``shardworker run --procs 2 --exit-when-idle`` on a fresh table (the handlers are in
``bench/bench_noop_app.py``). It prints

* **steps/s**: rows that landed in ``shardworker.job_steps`` over the run's time;
* **outcomes/s**: jobs ``done`` over the other run's time;
* their **ratio** (the issue's target: >= 0.8, a step costs no more than an outcome).

Each rate is taken two ways, as ``bench/throughput.py`` does: *wall* (launch to exit,
process startup and shutdown included) and *span* (first claim to last finish, from the
table). The machine is usually shared: ``--repeat R`` runs R rounds, alternating which of
the pair goes first, and the table shows medians (of the rates and of per-round ratios).
Each run also prints its cost: CPU seconds of the whole worker tree (``getrusage`` of the
reaped subprocess), of PostgreSQL (when it is a local server this user can read in /proc)
and the transactions PostgreSQL committed; the table ends with those per 1,000 steps and
per 1,000 outcomes.

Which shape is fair: a plain sync handler's step blocks until its record is fsync'd, one
at a time per child, while a sync handler's outcome is group-committed without waiting
for it; an ``async def`` (or ``threads=True``) handler has ``--concurrency`` jobs in
flight per child, whose steps share each fsync.

Usage::

    python bench/steps.py                                   # embedded PostgreSQL, N=3000, all shapes
    python bench/steps.py -n 2000 --shapes async --concurrency 10,50,200 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psycopg
from bench_db import database, load_jobs
from throughput import code_version, run_worker, write_app

STEPS = 10  # steps per job, as bench_noop_app.STEPS
TARGET_RATIO = 0.8
# shape: (the kind whose jobs record STEPS no-op steps, the no-op kind of the same shape)
SHAPES = {"sync": ("bench_steps", "bench_noop"), "async": ("bench_steps_async", "bench_noop_async"),
          "threads": ("bench_steps_threads", "bench_noop_threads")}


@dataclass(frozen=True)
class Variant:
    """A handler shape, and for async and threads the run's ``--concurrency``."""

    shape: str
    concurrency: int | None = None

    def __str__(self) -> str:
        return self.shape + (f" C={self.concurrency}" if self.concurrency else "")


@dataclass(frozen=True)
class Cost:
    """What a run cost besides time: the worker tree's CPU seconds (every process, reaped),
    PostgreSQL's (None when the server is not a local process this user can read), and the
    transactions PostgreSQL committed (each a WAL flush)."""

    worker_cpu_s: float
    pg_cpu_s: float | None
    commits: int


@dataclass(frozen=True)
class Run:
    """One measured run: ``count`` steps recorded (what == "steps") or outcomes done."""

    variant: Variant
    what: str
    count: int
    wall_s: float
    span_s: float
    cost: Cost

    @property
    def wall_rate(self) -> float:
        return self.count / self.wall_s

    @property
    def span_rate(self) -> float:
        return self.count / self.span_s


def steps_recorded(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM shardworker.job_steps").fetchone()
    assert row is not None
    return int(row[0])


def _cpu_s(pid: int, reaped: bool = False) -> float:
    """utime + stime of ``pid`` from /proc (plus its reaped children's with ``reaped``)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = [int(fields[i]) for i in ((11, 12, 13, 14) if reaped else (11, 12))]
    return sum(ticks) / os.sysconf("SC_CLK_TCK")


class PgMeter:
    """PostgreSQL's CPU seconds (its postmaster, its processes, their reaped children) and its
    commits in the bench's database, read before and after a run."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        with psycopg.connect(dsn, autocommit=True) as conn:
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()
        self.postmaster: int | None = None
        try:
            with open(f"/proc/{backend[0] if backend else 0}/stat", encoding="ascii") as f:
                self.postmaster = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            pass  # a remote server, or one this user cannot read: no CPU figure

    def read(self) -> tuple[float | None, int]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()
        return self._cpu(), int(row[0]) if row else 0

    def _cpu(self) -> float | None:
        if self.postmaster is None:
            return None
        try:
            total = _cpu_s(self.postmaster, reaped=True)
            with open(f"/proc/{self.postmaster}/task/{self.postmaster}/children", encoding="ascii") as f:
                for pid in f.read().split():
                    total += _cpu_s(int(pid), reaped=True)
        except OSError:
            return None
        return total


def measure(dsn: str, work_dir: str, variant: Variant, what: str, args: argparse.Namespace, pg: PgMeter) -> Run:
    """N jobs of STEPS steps (what == "steps") or STEPS x N no-op jobs, run to the end."""
    kind = SHAPES[variant.shape][0 if what == "steps" else 1]
    jobs = args.jobs if what == "steps" else args.jobs * STEPS
    load_jobs(dsn, jobs, kind)
    extra = ("--concurrency", str(variant.concurrency)) if variant.concurrency else ()
    pg_before, mine = pg.read(), resource.getrusage(resource.RUSAGE_CHILDREN)
    result = run_worker(dsn, work_dir, args.procs, jobs, Path(work_dir, f"worker-{variant.shape}-{what}.log"),
                        extra + tuple(args.worker_arg), f"{variant} {what}")
    after, pg_after = resource.getrusage(resource.RUSAGE_CHILDREN), pg.read()
    count = steps_recorded(dsn) if what == "steps" else jobs
    if what == "steps" and count != jobs * STEPS:
        raise RuntimeError(f"{count} steps landed in shardworker.job_steps, expected {jobs * STEPS}")
    pg_cpu = pg_after[0] - pg_before[0] if pg_after[0] is not None and pg_before[0] is not None else None
    cost = Cost(after.ru_utime + after.ru_stime - mine.ru_utime - mine.ru_stime, pg_cpu, pg_after[1] - pg_before[1])
    assert result.span_s is not None
    run = Run(variant, what, count, result.wall_s, result.span_s, cost)
    print(f"{variant!s:>12} {what:<8}: {count:>7,} in wall {run.wall_s:6.2f}s = {run.wall_rate:>7,.0f}/s, "
          f"span {run.span_s:6.2f}s = {run.span_rate:>7,.0f}/s; CPU worker {cost.worker_cpu_s:5.2f}s, PostgreSQL "
          f"{'-' if pg_cpu is None else format(pg_cpu, '5.2f')}s; {cost.commits:,} commits  "
          f"[load {os.getloadavg()[0]:.1f}]", flush=True)
    return run


def print_table(runs: list[Run], variants: list[Variant], repeats: int) -> None:
    """Per variant: the median rates and the median of the per-round ratios, wall and span;
    then what 1,000 steps and 1,000 outcomes cost in CPU and PostgreSQL commits."""
    print(f"\nmedians of {repeats} round(s); ratio = steps/s / outcomes/s, the median of each round's ratio")
    header = (f"{'shape':<12} {'steps/s':>9} {'outcomes/s':>11} {'ratio':>6}   "
              f"{'steps/s':>9} {'outcomes/s':>11} {'ratio':>6}")
    print(f"{'':<12} {'------------ wall ------------':>28}   {'------------ span ------------':>28}")
    print(header + "\n" + "-" * len(header))
    for variant in variants:
        steps, outcomes = (_of(runs, variant, what) for what in ("steps", "outcomes"))
        cells = []
        for rate in (lambda r: r.wall_rate, lambda r: r.span_rate):
            ratio = statistics.median(rate(s) / rate(o) for s, o in zip(steps, outcomes, strict=True))
            cells.append(f"{statistics.median(map(rate, steps)):>9,.0f} "
                         f"{statistics.median(map(rate, outcomes)):>11,.0f} {ratio:>6.2f}")
        print(f"{variant!s:<12} {cells[0]}   {cells[1]}")
    print(f"target: ratio >= {TARGET_RATIO} (a step costs no more than an outcome)\n")
    print("per 1,000 steps (in jobs of 10) | per 1,000 outcomes (no-op jobs): CPU s of the worker and of "
          "PostgreSQL, PostgreSQL commits (medians)")
    for variant in variants:
        print(f"{variant!s:<12} " + " | ".join(_cost_per_1000(_of(runs, variant, what))
                                                    for what in ("steps", "outcomes")))


def _of(runs: list[Run], variant: Variant, what: str) -> list[Run]:
    return [r for r in runs if r.variant == variant and r.what == what]


def _cost_per_1000(runs: list[Run]) -> str:
    def per(value: float, run: Run) -> float:
        return value * 1000 / run.count

    pg = [per(r.cost.pg_cpu_s, r) for r in runs if r.cost.pg_cpu_s is not None]
    return (f"worker {statistics.median(per(r.cost.worker_cpu_s, r) for r in runs):5.3f}, PostgreSQL "
            f"{format(statistics.median(pg), '5.3f') if pg else '  -  '}, "
            f"{statistics.median(per(r.cost.commits, r) for r in runs):5.1f} commits")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help="a scratch PostgreSQL database: the bench truncates "
                        "shardworker.jobs and shardworker.job_steps (default: a temporary embedded server)")
    parser.add_argument("-n", "--jobs", type=int, default=3000,
                        help=f"jobs of {STEPS} steps per run; the outcome runs get {STEPS} x N no-op jobs "
                             "(default 3000)")
    parser.add_argument("--procs", type=int, default=2, help="shardworker run --procs (default 2)")
    parser.add_argument("--shapes", default=",".join(SHAPES),
                        help=f"comma-separated handler shapes among {', '.join(SHAPES)} (default: all)")
    parser.add_argument("--concurrency", default="10,50",
                        help="comma-separated shardworker run --concurrency values for the async and threads "
                             "shapes, each measured (default 10,50; 10 is the worker's default)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds, alternating the order (default 3)")
    parser.add_argument("--worker-arg", action="append", default=[], metavar="ARG",
                        help="one more argument for shardworker run (repeatable)")
    args = parser.parse_args(argv)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if unknown := [s for s in shapes if s not in SHAPES]:
        parser.error(f"unknown shape(s) {', '.join(unknown)}: choose among {', '.join(SHAPES)}")
    try:
        concurrencies = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        parser.error(f"--concurrency takes integers separated by commas, not {args.concurrency!r}")
    args.variants = [Variant(shape, c) for shape in shapes for c in ([None] if shape == "sync" else concurrencies)]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"shardworker {code_version()}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"N={args.jobs} jobs x {STEPS} steps against {args.jobs * STEPS} no-op jobs, --procs {args.procs}",
          flush=True)
    work_dir = tempfile.mkdtemp(prefix="sw-bench-steps-")
    write_app(work_dir)
    runs: list[Run] = []
    try:
        with database(args.dsn) as dsn:
            pg = PgMeter(dsn)
            for round_no in range(args.repeat):
                for variant in args.variants:
                    pair = ("steps", "outcomes") if round_no % 2 == 0 else ("outcomes", "steps")
                    runs.extend(measure(dsn, work_dir, variant, what, args, pg) for what in pair)
        print_table(runs, args.variants, args.repeat)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
