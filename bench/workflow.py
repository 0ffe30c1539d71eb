"""Workflows: what follow-up jobs and dependencies cost beside plain enqueues (issue 24).

Each workload runs on a fresh table through a real ``shardworker run --procs 2
--exit-when-idle`` (handlers in ``bench/bench_noop_app.py``), N jobs each (``-n``, default
10,000):

* **plain**: the client enqueues N no-op jobs with ``enqueue_many`` (one transaction:
  *enqueues/s*), then the worker runs them (*done/s* from first claim to last finish).
* **follow-ups**: ``--parents`` jobs (default 10) each ``job.enqueue`` N/parents no-op
  follow-ups, scheduled an hour ahead so the run only inserts them. *inserted/s* = N over
  the time from the first of those jobs claimed to the last follow-up visible (a thread
  polls every 10 ms): the whole way of a follow-up (encoded in the child, fsync'd in the
  outbox, decoded and inserted by the flusher in the transaction that applies its job).
* **fan-in**: one job enqueues N no-op follow-ups and one merge after all of them (issue 24,
  point 5). Each part applied as done is one dependency release (the merge's count of
  pending dependencies goes down, in the part's apply transaction): *releases/s* = N over the
  parts' span, beside *done/s* of the same N follow-ups with no merge (**fan-out**: children
  already warm when the parts are claimed, unlike plain's run). Also printed: the whole
  workflow (the job's claim to the merge done) and how soon the merge was claimed after the
  last part finished.
* **chains**: ``--chains`` jobs (default 100) each enqueue a chain of N/chains no-op
  follow-ups, each after the one before: every release queues the next link, so a chain
  moves one hop per claim, run, fsync and apply. *releases/s* over the links' span (beside
  fan-out's done/s), and the time per hop.

Spans come from the table (``attempted_at``, ``finished_at``: the server's transaction
times). The machine is usually shared: ``--repeat R`` runs R rounds and the table shows
medians.

Usage::

    python bench/workflow.py                      # embedded PostgreSQL, N=10000, 3 rounds
    python bench/workflow.py -n 20000 --repeat 5 --dsn postgresql://...
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from bench_db import database
from throughput import code_version, time_worker, write_app

from shardworker import JobSpec, enqueue_many

HOUR_S = 3600.0


@dataclass(frozen=True)
class Run:
    """One measured workload: ``count`` things (jobs, rows, releases) at ``rate`` per second."""

    workload: str
    count: int
    wall_s: float | None  # the worker run, launch to exit (for plain's enqueue: the client's call)
    span_s: float | None  # from the table
    rate: float
    unit: str
    note: str = ""


@dataclass(frozen=True)
class Bench:
    """Where the runs go: the database, the app's directory, the options."""

    dsn: str
    work_dir: str
    args: argparse.Namespace

    def fresh(self, specs: list[JobSpec]) -> float:
        """Empty the tables, enqueue ``specs`` in one call and settle the server; the call's seconds."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("TRUNCATE shardworker.jobs CASCADE")
            started = time.perf_counter()
            if enqueue_many(conn, specs) != len(specs):
                raise RuntimeError(f"expected {len(specs)} jobs enqueued")
            took = time.perf_counter() - started
            conn.execute("ANALYZE shardworker.jobs")
            with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
                conn.execute("CHECKPOINT")
        return took

    def run(self, name: str) -> float:
        """One ``shardworker run --exit-when-idle`` to its end; its wall seconds."""
        log = Path(self.work_dir, f"worker-{name}.log")
        return time_worker(self.dsn, self.work_dir, self.args.procs, log, tuple(self.args.worker_arg))[0]

    def fetch(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return conn.execute(sql, params or None).fetchall()

    def span(self, kind: str, expected: int) -> tuple[float, float]:
        """(first claim, last finish) of the jobs of ``kind``, as epoch seconds, once all ``expected`` are done."""
        ((done, first, last),) = self.fetch(
            "SELECT count(*) FILTER (WHERE status = 'done'), extract(epoch FROM min(attempted_at)), "
            "extract(epoch FROM max(finished_at)) FROM shardworker.jobs WHERE kind = %s", kind)
        if done != expected:
            raise RuntimeError(f"{done} {kind} jobs done, expected {expected}")
        return float(first), float(last)


def plain(bench: Bench) -> list[Run]:
    n = bench.args.jobs
    client_s = bench.fresh([JobSpec("bench_noop") for _ in range(n)])
    wall = bench.run("plain")
    first, last = bench.span("bench_noop", n)
    return [Run("plain: enqueue_many (client)", n, client_s, None, n / client_s, "enqueues/s"),
            Run("plain: the jobs run", n, wall, last - first, n / (last - first), "done/s")]


def follow_ups(bench: Bench) -> list[Run]:
    parents, n = bench.args.parents, bench.args.jobs
    each = n // parents
    bench.fresh([JobSpec("bench_fanout", {"n": each, "delay_s": HOUR_S}) for _ in range(parents)])
    ((after_id,),) = bench.fetch("SELECT max(id) FROM shardworker.jobs")
    with Watch(bench.dsn, after_id, each * parents) as watch:
        wall = bench.run("follow-ups")
    first, _ = bench.span("bench_fanout", parents)
    if watch.landed_at is None:
        raise RuntimeError(f"the {each * parents} follow-ups never all landed")
    took = watch.landed_at - first
    return [Run(f"follow-ups: {parents} jobs x {each:,}", each * parents, wall, took, each * parents / took,
                "inserted/s")]


class Watch:
    """Polls (every 10 ms, on a thread of its own) how many jobs with an id above ``after_id``
    are visible, and notes the server's clock when all ``expected`` are: when the last
    follow-up's transaction committed, within 10 ms."""

    def __init__(self, dsn: str, after_id: int, expected: int) -> None:
        self.dsn, self.after_id, self.expected = dsn, after_id, expected
        self.landed_at: float | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> Watch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def _poll(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                row = conn.execute("SELECT count(*), extract(epoch FROM clock_timestamp()) FROM shardworker.jobs "
                                   "WHERE id > %s", (self.after_id,)).fetchone()
                if row is not None and row[0] >= self.expected:
                    self.landed_at = float(row[1])
                    return
                self.stop.wait(0.01)


def fan_in(bench: Bench) -> list[Run]:
    n = bench.args.jobs
    bench.fresh([JobSpec("bench_fanout", {"n": n})])
    wall = bench.run("fan-out")
    first, last = bench.span("bench_noop", n)
    runs = [Run(f"fan-out: 1 job -> {n:,}", n, wall, last - first, n / (last - first), "done/s")]
    bench.fresh([JobSpec("bench_fanout", {"n": n, "merge": True})])
    wall = bench.run("fan-in")
    first, last = bench.span("bench_noop", n)
    ((seen, claimed, merge_claimed, merge_done),) = bench.fetch(
        "SELECT m.result, extract(epoch FROM p.attempted_at), extract(epoch FROM m.attempted_at), "
        "extract(epoch FROM m.finished_at) FROM shardworker.jobs m, shardworker.jobs p "
        "WHERE m.kind = 'bench_merge' AND p.kind = 'bench_fanout' AND m.status = 'done'")
    if seen != n:
        raise RuntimeError(f"the merge saw {seen} results, expected {n}")
    note = (f"job claimed to merge done {float(merge_done) - float(claimed):.2f} s; merge claimed "
            f"{(float(merge_claimed) - last) * 1000:.0f} ms after the last part")
    return [*runs, Run(f"fan-in: 1 job -> {n:,} + 1 merge", n, wall, last - first, n / (last - first),
                       "releases/s", note)]


def chains(bench: Bench) -> list[Run]:
    count, n = bench.args.chains, bench.args.jobs
    length = n // count
    bench.fresh([JobSpec("bench_fanout", {"n": length, "chain": True}) for _ in range(count)])
    wall = bench.run("chains")
    first, last = bench.span("bench_noop", count * length)
    releases = count * (length - 1)
    return [Run(f"chains: {count} x {length}", releases, wall, last - first, releases / (last - first),
                "releases/s", f"{(last - first) / length * 1000:.1f} ms per hop")]


WORKLOADS = {"plain": plain, "follow-ups": follow_ups, "fan-in": fan_in, "chains": chains}


def print_run(run: Run) -> None:
    wall = "" if run.wall_s is None else f" wall {run.wall_s:.2f}s"
    span = "" if run.span_s is None else f" span {run.span_s:.2f}s"
    print(f"{run.workload:<34} {run.count:>7,}{wall}{span}: {run.rate:>8,.0f} {run.unit}"
          f"{'; ' + run.note if run.note else ''}  [load {os.getloadavg()[0]:.1f}]", flush=True)


def print_table(runs: list[Run], repeats: int) -> None:
    """Per workload, the run with the median rate (upper median for an even count)."""
    print(f"\nmedian of {repeats} round(s) (wall: the worker's launch to exit, or the client's call; "
          "span: first claim to last finish, from the table; for follow-ups, to the last one visible)")
    header = f"{'workload':<34} {'count':>7} {'wall s':>7} {'span s':>7} {'rate':>9}  unit"
    print(header + "\n" + "-" * len(header))
    names = list(dict.fromkeys(r.workload for r in runs))
    for name in names:
        mine = sorted((r for r in runs if r.workload == name), key=lambda r: r.rate)
        r = mine[len(mine) // 2]
        wall = "-" if r.wall_s is None else f"{r.wall_s:.2f}"
        span = "-" if r.span_s is None else f"{r.span_s:.2f}"
        print(f"{r.workload:<34} {r.count:>7,} {wall:>7} {span:>7} {r.rate:>9,.0f}  {r.unit}"
              f"{'  (' + r.note + ')' if r.note else ''}")
    for name, base in (("follow-ups", "plain: enqueue_many"), ("fan-in", "fan-out"), ("chains", "fan-out")):
        rate, base_rate = _median_rate(runs, name), _median_rate(runs, base)
        if rate and base_rate:
            print(f"{name} / {base}: {rate / base_rate:.2f}")


def _median_rate(runs: list[Run], prefix: str) -> float | None:
    rates = [r.rate for r in runs if r.workload.startswith(prefix)]
    return statistics.median(rates) if rates else None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help="a scratch PostgreSQL database: the bench truncates "
                        "shardworker.jobs and what references it (default: a temporary embedded server)")
    parser.add_argument("-n", "--jobs", type=int, default=10_000, help="jobs per workload (default 10000)")
    parser.add_argument("--parents", type=int, default=10, help="jobs sharing the follow-ups (default 10)")
    parser.add_argument("--chains", type=int, default=100, help="chains sharing the jobs (default 100)")
    parser.add_argument("--procs", type=int, default=2, help="shardworker run --procs (default 2)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated, among {', '.join(WORKLOADS)} (default: all)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the table shows medians (default 3)")
    parser.add_argument("--worker-arg", action="append", default=[], metavar="ARG",
                        help="one more argument for shardworker run (repeatable)")
    args = parser.parse_args(argv)
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if unknown := [w for w in args.workloads if w not in WORKLOADS]:
        parser.error(f"unknown workload(s) {', '.join(unknown)}: choose among {', '.join(WORKLOADS)}")
    if args.jobs < max(args.parents, 2 * args.chains) or min(args.parents, args.chains) < 1:
        parser.error("-n must be at least --parents and twice --chains, both at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"shardworker {code_version()}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"N={args.jobs}, --procs {args.procs}", flush=True)
    work_dir = tempfile.mkdtemp(prefix="sw-bench-workflow-")
    write_app(work_dir)
    runs: list[Run] = []
    try:
        with database(args.dsn) as dsn:
            bench = Bench(dsn, work_dir, args)
            for _ in range(args.repeat):
                for name in args.workloads:
                    for run in WORKLOADS[name](bench):
                        print_run(run)
                        runs.append(run)
        print_table(runs, args.repeat)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
