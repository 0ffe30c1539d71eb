"""``shardworker demo --outage``: the promise, live.

On an embedded PostgreSQL of its own (under ``.shardworker/outage-demo/``, so no other
database is ever stopped), the demo enqueues jobs and starts a real worker
(``shardworker run``, a subprocess, its log in the demo's directory). Once part of the
work is done it stops PostgreSQL (``pg_ctl stop -m immediate``: a crash, not a polite
shutdown), shows the outbox filling while the children finish what they hold, starts
PostgreSQL again, shows the outbox draining, and ends with a table: jobs, handler runs,
re-runs, how long the database was away, how many outcomes waited, how long they took to
land. Each handler run is counted from inside the handler, in a ledger file it appends to
and fsyncs, so a re-run could not hide.

On a terminal the progress line redraws in place; otherwise only the phases are printed.
"""

from __future__ import annotations

import collections
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from shardworker.demo.harness import DemoFailed, Display, Stage, table

QUEUE = "outage-demo"

__all__ = ["DemoFailed", "Result", "run"]


@dataclass
class Result:
    jobs: int
    handler_runs: int
    rerun_jobs: int
    outage_s: float
    peak_pending: int
    drain_s: float
    statuses: dict[str, int]

    def table(self) -> str:
        return table([("jobs", f"{self.jobs:,}"),
                      ("handler runs", f"{self.handler_runs:,}"),
                      ("re-runs", f"{self.rerun_jobs:,}"),
                      ("PostgreSQL down", f"{self.outage_s:.1f} s (stopped with pg_ctl -m immediate)"),
                      ("outcomes that waited", f"{self.peak_pending:,} (fsync'd in the outbox, on local disk)"),
                      ("time to drain", f"{self.drain_s:.1f} s (from PostgreSQL back to the outbox empty)"),
                      ("final rows", ", ".join(f"{status} {n:,}" for status, n in sorted(self.statuses.items())))])


def run(jobs: int, procs: int, outage_s: float, stream: TextIO = sys.stderr,
        clock: Callable[[], float] = time.monotonic) -> Result:
    with Stage("outage-demo", QUEUE, Display(stream)) as stage:
        return _run(stage, jobs, procs, outage_s, clock)


def _run(stage: Stage, jobs: int, procs: int, outage_s: float, clock: Callable[[], float]) -> Result:
    display = stage.display
    stage.run_into_outage("demo.outage", jobs, "jobs", "shardworker.demo.app:app", procs, "--prefetch", "400")
    down_at, peak = clock(), [0]

    def line() -> str:
        pending = stage.pending()
        peak[0] = max(peak[0], pending)
        return (f"PostgreSQL down {clock() - down_at:4.1f}s | handler runs {sum(_runs_per_job(stage).values()):,}"
                f"/{jobs:,} | outcomes waiting in the outbox {pending:,}")

    stage.show_for(outage_s, line, clock)
    peak[0] = max(peak[0], stage.pending())
    display.phase(f"{peak[0]:,} outcomes waited in the outbox; starting PostgreSQL again …")
    stage.start_db()
    back_at = clock()
    drain = stage.run_to_the_end(jobs, back_at, clock)
    display.phase("every job done; stopping the worker")
    stage.stop_worker()
    runs = _runs_per_job(stage)
    return Result(jobs, sum(runs.values()), sum(1 for n in runs.values() if n > 1), back_at - down_at, peak[0],
                  drain, stage.counts())


def _runs_per_job(stage: Stage) -> collections.Counter[int]:
    """Handler runs by job id: the handler appends "JOB ATTEMPT" to the ledger each run."""
    return collections.Counter(int(words[0]) for words in stage.ledger())
