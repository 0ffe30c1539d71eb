"""The child process: runs handlers and makes their outcomes durable in its own outbox shard.

A child never holds a database connection. Its main thread reads the parent's pipe and
hands each job to a lane (``shardworker.child.lanes``: one at a time for plain sync handlers, a
thread pool for ``threads=True``, an event loop for ``async def``); the committer
(``shardworker.child.committer``) group-commits finished outcomes and only then reports them.
Because the main thread always reads, the parent's sends never wait on a busy handler, and
a ``Recall`` is answered at once: the jobs not started yet go back to the parent
(``Returned``), which gives them to a child that is free. The app's ``on_startup`` hooks run
before the child reads its first job and its ``on_shutdown`` hooks after its last
(``shardworker.child.hooks``); a startup hook that raises ends the child with
``EXIT_START_FAILED`` and a ``Fatal`` that says so, and the parent stops the worker.

``Progress`` (``shardworker.child.progress``), a file every process maps, has one slot per
job in flight: the child marks it when the handler starts and when it finishes.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from outbox import OutboxLocked, ShardWriter, WriterConfig
from shardworker.app import App, load_app
from shardworker.child.cancels import OPERATOR_CANCEL, Cancels
from shardworker.child.committer import Committer
from shardworker.child.gate import StartGate
from shardworker.child.hooks import EventLoop, HookFailed, Hooks
from shardworker.child.lanes import AsyncLane, Lane, ThreadLane
from shardworker.child.progress import Progress, ProgressFile
from shardworker.child.steps import StepLog
from shardworker.core import logs, procs, tracing, wire
from shardworker.core.config import ChildConfig
from shardworker.core.jobstats import OUTCOMES, STEP_RECORDED, STEP_REPLAYED, outcome_label, summarize
from shardworker.core.model import ClaimedJob, Disposition, Outcome

log = logging.getLogger(__name__)

EXIT_OUTBOX_FAILED = 3  # the child exits with this when its outbox cannot take outcomes
EXIT_START_FAILED = 4  # ... and with this when a startup hook raised: restarting it would not help


class ShardRunner:
    """The child's loop, apart from process plumbing so tests can drive it in-process."""

    def __init__(self, config: ChildConfig, app: App, writer: ShardWriter, inbox_fd: int, outbox_fd: int,
                 progress: Progress, gate: StartGate | None = None) -> None:
        self.config, self.app, self.progress, self.gate = config, app, progress, gate or StartGate()
        self.inbox_fd, self.outbox_fd = inbox_fd, outbox_fd
        self._send_lock = threading.Lock()
        self._stopping = threading.Event()  # the parent said stop: steps waiting for the gate give up
        self.committer = Committer(writer, lambda keys, stats: self.send(wire.Done(tuple(keys), summarize(stats))),
                                   max_records=config.group_commit_max_records,
                                   max_bytes=config.group_commit_max_bytes,
                                   max_delay_s=config.group_commit_max_delay_s, on_fatal=self.fatal)
        self.lanes: dict[str, Lane] = {}
        self.cancels = Cancels()
        self.events = EventLoop()
        self.hooks = Hooks(app, self.events)

    def send(self, msg: wire.Message) -> None:
        with self._send_lock:
            wire.write_frame(self.outbox_fd, msg)

    def run(self) -> None:
        """Run the startup hooks, then jobs until the parent says stop (or goes away), then the
        shutdown hooks, and report what never started. ``HookFailed`` when a startup hook raised."""
        self.committer.start()
        try:
            self.hooks.startup()
        except HookFailed:
            self.events.stop(1.0)
            self.committer.stop()
            raise
        self.progress.mark_up()
        while (msg := wire.read_frame(self.inbox_fd)) is not None and not isinstance(msg, wire.Stop):
            if isinstance(msg, wire.Jobs):
                self.committer.expect(len(msg.jobs))
                self._submit(msg.jobs, msg.slots)
            elif isinstance(msg, wire.CancelJobs):
                held = self.cancels.cancel(msg.jobs)
                for lane in self.lanes.values():
                    lane.cancel(held)
            elif isinstance(msg, wire.Recall):
                self._recall()
        self._stopping.set()  # a step waiting for the start gate gives up
        unstarted = [job for lane in self.lanes.values() for _, job in lane.stop()]
        self.committer.forget(len(unstarted))
        for lane in self.lanes.values():
            lane.join()
        self.hooks.shutdown()
        tracing.flush()  # the spans the app's processors still hold: no atexit runs in a child
        self.events.stop()
        self.committer.stop()
        if msg is not None:
            self.send(wire.Stopped(tuple((j.id, j.attempt) for j in unstarted)))

    def _recall(self) -> None:
        """Give the parent back every job not started yet, so an idle peer can run it."""
        returned = [job for lane in self.lanes.values() for _, job in lane.withdraw()]
        self.cancels.release((j.id, j.attempt) for j in returned)
        self.committer.forget(len(returned))
        self.send(wire.Returned(tuple((j.id, j.attempt) for j in returned)))

    def _submit(self, jobs: Sequence[ClaimedJob], slots: Sequence[int]) -> None:
        """Hand the jobs of one message to their lanes, each lane its share at once (in order)."""
        by_lane: dict[int, tuple[Lane, list[tuple[int, ClaimedJob]]]] = {}
        for job, slot in zip(jobs, slots, strict=True):
            self.cancels.hold((job.id, job.attempt))
            lane = self._lane(job)
            by_lane.setdefault(id(lane), (lane, []))[1].append((slot, job))
        for lane, batch in by_lane.values():
            lane.submit(batch)

    def _lane(self, job: ClaimedJob) -> Lane:
        spec = self.app.handlers.get(job.kind)
        name = spec.lane if spec is not None else "sync"
        lane = self.lanes.get(name)
        if lane is None:
            if name == "async":
                lane = AsyncLane(self.app, self.config.concurrency, self._started, self._finished, self._steps_for,
                                 self.cancels, self.hooks, self.gate)
            else:
                threads = self.config.concurrency if name == "threads" else 1
                lane = ThreadLane(self.app, threads, self._started, self._finished, self._steps_for,
                                  f"shardworker-{name}", self.cancels, self.hooks, self.gate)
            self.lanes[name] = lane
        return lane

    def _started(self, slot: int, job: ClaimedJob) -> None:
        self.progress.begin(slot, job.id)

    def _steps_for(self, job: ClaimedJob) -> StepLog:
        """The step log of a run of ``job``: its records go to the committer, at once."""
        stat = ((job.kind, STEP_RECORDED, -1.0),)
        return StepLog(job, lambda record, on_durable: self.committer.add_step(record, on_durable, stat),
                       lambda record: self.committer.commit_step(record, stat), self.gate, self._stopping.is_set,
                       self.committer.add_note)

    def _finished(self, slot: int, job: ClaimedJob, outcome: Outcome, started_at: float, steps: StepLog) -> None:
        seconds = time.monotonic() - started_at
        self.progress.finish(slot)
        self.cancels.release(((job.id, job.attempt),))
        label = outcome_label(job, outcome)
        replays = ((job.kind, STEP_REPLAYED, -1.0),) * steps.replayed
        self.committer.add((job.id, job.attempt), wire.encode_outcome(outcome.claimed_by(job)), started_at,
                           ((job.kind, OUTCOMES.index(label), seconds), *replays))
        if outcome.disposition in (Disposition.SNOOZED, Disposition.CANCELLED, Disposition.SUSPENDED):
            log_control(job, outcome)
        elif outcome.disposition is not Disposition.DONE:
            log_failure(job, outcome)

    def fatal(self, exc: BaseException) -> None:
        """The outbox cannot take outcomes: tell the parent and exit, so unacknowledged jobs run again."""
        self.send(wire.Fatal(procs.one_line(exc)))
        os._exit(EXIT_OUTBOX_FAILED)


def log_failure(job: ClaimedJob, outcome: Outcome) -> None:
    """One line per failed attempt: kind, id, attempts used of the job's max_attempts (the
    row's, as ``jobs list`` shows them) and the error's first line. The final one is an ERROR
    followed by the traceback (``logs.log_traceback``); a retry is one WARNING line, its
    traceback logged only at DEBUG: every attempt's is in the job's error history
    (``jobs show``), and a log of planned retries should not read as a log of failures."""
    first = (outcome.error or "").strip().splitlines()[0] if outcome.error else "failed"
    fields = logs.job_fields(job)
    if outcome_label(job, outcome) == "failed":
        logs.log_traceback(log, logging.ERROR, outcome.traceback, "job %d (%s) attempt %d/%d failed for good: %s",
                           job.id, job.kind, job.attempts_used, job.max_attempts, first, extra=fields)
        return
    log.warning("job %d (%s) attempt %d/%d failed, retrying in %.1fs: %s", job.id, job.kind, job.attempts_used,
                job.max_attempts, outcome.delay_s, first, extra=fields)
    logs.log_traceback(log, logging.DEBUG, outcome.traceback, "job %d (%s) attempt %d: the traceback", job.id,
                       job.kind, job.attempts_used, extra=fields)


def log_control(job: ClaimedJob, outcome: Outcome) -> None:
    """One line for a job its handler snoozed, suspended at a wait, or cancelled."""
    if outcome.disposition is Disposition.SUSPENDED:
        log.info("job %d (%s) attempt %d waits (its worker slot is free until it runs again)", job.id, job.kind,
                 job.attempt, extra=logs.job_fields(job))
    elif outcome.disposition is Disposition.SNOOZED:
        log.info("job %d (%s) attempt %d snoozed for %.1fs", job.id, job.kind, job.attempt, outcome.delay_s,
                 extra=logs.job_fields(job))
    elif outcome.error == OPERATOR_CANCEL:
        log.info("job %d (%s) attempt %d stopped: %s", job.id, job.kind, job.attempt, OPERATOR_CANCEL,
                 extra=logs.job_fields(job))
    else:
        log.info("job %d (%s) attempt %d cancelled by its handler: %s", job.id, job.kind, job.attempt,
                 outcome.error, extra=logs.job_fields(job))


def open_writer(config: ChildConfig, wait_s: float = 30.0) -> ShardWriter:
    """Open this shard's writer, waiting while a dying predecessor or a recovering flusher holds it."""
    return procs.wait_for_lock(lambda: ShardWriter.open(config.outbox_dir, config.shard,
                                                        WriterConfig(segment_bytes=config.segment_bytes)),
                               OutboxLocked, wait_s)


def child_main(config: ChildConfig, inbox: Any, outbox: Any, progress: ProgressFile,
               log_setup: logs.LogSetup | None = None, alive_until: Any = None) -> None:
    """Entry point of a child process (forked or spawned); ``inbox``/``outbox`` are pipe ends,
    ``progress`` the file of its slots (it maps it itself), ``alive_until`` its ``StartGate``'s."""
    procs.become_worker_process(config.parent_pid, f"shard-{config.shard}", log_setup)
    inbox_fd, outbox_fd = inbox.fileno(), outbox.fileno()
    try:
        app = load_app(config.app_ref).with_default_timeout(config.default_timeout_s)
        writer = open_writer(config)
    except Exception as exc:
        wire.write_frame(outbox_fd, wire.Fatal(procs.one_line(exc)))
        os._exit(EXIT_OUTBOX_FAILED)
    runner = ShardRunner(config, app, writer, inbox_fd, outbox_fd, progress.open(), StartGate(alive_until))
    try:
        runner.run()
    except HookFailed as exc:
        writer.close()
        wire.write_frame(outbox_fd, wire.Fatal(str(exc), at_start=True))
        os._exit(EXIT_START_FAILED)
    except OSError as exc:
        log.debug("pipe to the parent closed: %s", exc)  # the parent is gone; durable outcomes stay
    writer.close()
