"""``shardworker demo --steps``: durable steps, live.

On an embedded PostgreSQL of its own (under ``.shardworker/steps-demo/``), the demo enqueues
jobs of four steps (``shardworker.demo.steps_app``) and starts a real worker. Once a fifth of
the jobs are done it stops PostgreSQL (``pg_ctl stop -m immediate``), lets the worker go on
into its outbox for a while, kills the whole worker with SIGKILL (parent, children, flusher)
while jobs are between steps, and starts a worker again on the same outbox while PostgreSQL
is still down. Then it starts PostgreSQL and runs every job to the end: the jobs the kill
cut run again, and get the steps they had recorded back.

What the table counts comes from the ledger the handler and its steps append to and fsync:
*steps run* are calls of step functions; *steps replayed* are steps ``job.step`` gave back
from an earlier attempt's record without calling the function. A step *re-ran* if its
function ran again after the step had returned, that is after the attempt whose record
landed in ``shardworker.job_steps`` (``job.step`` returns only once its record is fsync'd;
the first record wins). A step function that finished but was killed before its record was
fsync'd had not returned: it may run again, and the table says how many did.
"""

from __future__ import annotations

import collections
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from shardworker.demo.harness import Display, Stage, table
from shardworker.demo.steps_app import STEPS

QUEUE = "steps-demo"
APP_REF = "shardworker.demo.steps_app:app"
CONCURRENCY = 20  # threads per child: jobs between steps when the kill comes
WORKER_ARGS = ("--concurrency", str(CONCURRENCY), "--prefetch", "400")
KILL_AT = 0.4  # of the outage: the rest of it, the restarted worker waits for PostgreSQL


@dataclass
class Result:
    jobs: int
    handler_runs: int
    jobs_run_again: int
    between_steps: int  # jobs with some steps run and some not when the worker was killed
    steps_run: int
    steps_unreturned: int  # step functions run again that were killed before their record was durable
    steps_replayed: int
    steps_rerun: int
    steps_recorded: int
    outage_s: float
    killed_after_s: float
    statuses: dict[str, int]

    def table(self) -> str:
        again = (f"; {self.steps_unreturned:,} of them again: killed before its record was fsync'd, the step "
                 "had not returned" if self.steps_unreturned else "")
        return table([
            ("jobs", f"{self.jobs:,} ({len(STEPS)} steps each)"),
            ("steps run", f"{self.steps_run:,} (step functions called, counted inside{again})"),
            ("steps replayed", f"{self.steps_replayed:,} (recorded before the kill, given back to the next "
                               "attempt without calling the function)"),
            ("steps re-run", f"{self.steps_rerun:,} (a step that had returned, run again)"),
            ("handler runs", f"{self.handler_runs:,} ({self.jobs_run_again:,} jobs ran again after the kill -9; "
                             f"{self.between_steps:,} were between steps)"),
            ("steps recorded", f"{self.steps_recorded:,} rows in shardworker.job_steps"),
            ("PostgreSQL down", f"{self.outage_s:.1f} s; the worker killed -9 after {self.killed_after_s:.1f} s "
                                "and started again while it was down"),
            ("final rows", ", ".join(f"{status} {n:,}" for status, n in sorted(self.statuses.items())))])


def run(jobs: int, procs: int, outage_s: float, stream: TextIO = sys.stderr,
        clock: Callable[[], float] = time.monotonic) -> Result:
    with Stage("steps-demo", QUEUE, Display(stream)) as stage:
        return _run(stage, jobs, procs, outage_s, clock)


def _run(stage: Stage, jobs: int, procs: int, outage_s: float, clock: Callable[[], float]) -> Result:
    display = stage.display
    stage.run_into_outage("demo.steps", jobs, f"jobs of {len(STEPS)} steps", APP_REF, procs, *WORKER_ARGS)
    down_at = clock()

    def line() -> str:
        steps_run = sum(1 for words in stage.ledger() if words[0] == "step")
        return (f"PostgreSQL down {clock() - down_at:4.1f}s | steps run {steps_run:,}/{jobs * len(STEPS):,} | "
                f"records waiting in the outbox {stage.pending():,}")

    stage.show_for(outage_s * KILL_AT, line, clock)
    while _between_steps(stage) == 0 and clock() - down_at < outage_s:  # the kill is to cut jobs mid-way
        stage.check_alive()
        time.sleep(0.02)
    stage.kill_worker()
    killed_after = clock() - down_at
    between = _between_steps(stage)
    display.phase(f"kill -9 of the whole worker (parent, children, flusher): {between:,} jobs were between steps; "
                  "starting it again on the same outbox, PostgreSQL still down …")
    stage.start_worker(APP_REF, procs, *WORKER_ARGS)
    stage.show_for(outage_s - (clock() - down_at), line, clock)
    display.phase("starting PostgreSQL again …")
    stage.start_db()
    back_at = clock()
    stage.run_to_the_end(jobs, back_at, clock)
    display.phase("every job done; stopping the worker")
    stage.stop_worker()
    return _count(stage, jobs, between, back_at - down_at, killed_after)


def _between_steps(stage: Stage) -> int:
    """Jobs with some of their steps run and some not, from the ledger."""
    steps_run = collections.Counter(words[1] for words in stage.ledger() if words[0] == "step")
    return sum(1 for n in steps_run.values() if n < len(STEPS))


def _count(stage: Stage, jobs: int, between: int, outage_s: float, killed_after_s: float) -> Result:
    """The final table's numbers: the ledger's runs held against the attempts that recorded each step."""
    ledger = list(stage.ledger())
    runs = collections.Counter(int(words[1]) for words in ledger if words[0] == "run")
    step_attempts: dict[tuple[int, str], list[int]] = collections.defaultdict(list)
    for tag, job_id, attempt, *name in ledger:
        if tag == "step":
            step_attempts[(int(job_id), name[0])].append(int(attempt))
    recorded = {(job_id, name): attempt for job_id, name, attempt in stage.store.recorded_steps(QUEUE)}
    unreturned = rerun = 0
    for key, attempts in step_attempts.items():
        at = recorded.get(key, min(attempts))  # a step never recorded: any second run counts against it
        unreturned += sum(1 for a in attempts if a < at)
        rerun += sum(1 for a in attempts if a >= at) - 1
    return Result(jobs, sum(runs.values()), sum(1 for n in runs.values() if n > 1), between,
                  sum(len(a) for a in step_attempts.values()), unreturned,
                  sum(1 for words in ledger if words[0] == "replay"), rerun, len(recorded), outage_s,
                  killed_after_s, stage.counts())
