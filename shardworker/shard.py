"""The child process: runs handlers and appends outcomes to its own outbox shard.

A child never holds a database connection. It receives batches of claimed jobs from the
parent over a pipe, runs each handler, appends the outcome to its shard, and commits
(one write, one fdatasync) when the batch is done, when ``group_commit_max_records``
outcomes wait, or when the oldest waiting outcome is ``group_commit_max_delay_s`` old,
so a slow handler's result is durable right away. Only after the commit does it report
the jobs finished.

Messages are those of ``shardworker.wire``. ``Progress``, in shared memory, tells the
parent which job runs now and since when, and how many this child has started.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson

from outbox import OutboxError, OutboxFull, OutboxLocked, ShardWriter, WriterConfig
from shardworker import procs, wire
from shardworker.app import App, load_app
from shardworker.model import ClaimedJob, Outcome

log = logging.getLogger(__name__)

EXIT_OUTBOX_FAILED = 3  # the child exits with this when its outbox cannot take outcomes


class Progress:
    """A child's progress in shared memory (``ctx.Array("q", Progress.WIDTH)``): the job it
    runs now (0: none), when that started (``time.monotonic()`` in ms, one clock for every
    process of the host), and how many jobs it has started. Written by the child only; the
    parent reads it for timeouts and after a death."""

    WIDTH = 3
    _JOB, _STARTED_MS, _STARTED = range(3)

    def __init__(self, array: Any) -> None:
        self.array = array

    def begin(self, job_id: int, started: int) -> None:
        self.array[self._JOB], self.array[self._STARTED_MS] = job_id, int(time.monotonic() * 1000)
        self.array[self._STARTED] = started

    def end(self) -> None:
        self.array[self._JOB] = 0

    @property
    def job_id(self) -> int:
        return int(self.array[self._JOB])

    @property
    def started_at(self) -> float:
        """When the current job started, in ``time.monotonic()`` seconds."""
        return self.array[self._STARTED_MS] / 1000

    @property
    def started(self) -> int:
        return int(self.array[self._STARTED])


@dataclass(frozen=True)
class ChildConfig:
    shard: int
    outbox_dir: str
    app_ref: str
    group_commit_max_delay_s: float
    group_commit_max_records: int
    segment_bytes: int
    parent_pid: int


def run_handler(app: App, job: ClaimedJob) -> Outcome:
    """Run one job's handler and turn whatever happens into an Outcome."""
    spec = app.handlers.get(job.kind)
    if spec is None:
        return Outcome(job.id, job.attempt, False, error=f"no handler for kind {job.kind!r}", retry_delay_s=-1.0)
    try:
        result = spec.fn(job.to_job())
    except Exception as exc:
        return _failure(app, job, exc)
    try:
        result_json = orjson.dumps(result).decode()
    except orjson.JSONEncodeError as exc:
        # Running it again would compute the same unstorable value: fail for good.
        return Outcome(job.id, job.attempt, False, error=f"handler result is not JSON-serializable: {exc}",
                       retry_delay_s=-1.0)
    return Outcome(job.id, job.attempt, True, result_json=result_json)


def _failure(app: App, job: ClaimedJob, exc: BaseException) -> Outcome:
    text = "".join(traceback.format_exception(exc)).strip()
    return Outcome(job.id, job.attempt, False, error=f"{type(exc).__name__}: {exc}\n{text}",
                   retry_delay_s=app.handlers[job.kind].delay_after_failure(job.attempt))


class ShardRunner:
    """The child's loop, separated from process plumbing so tests can drive it."""

    def __init__(self, config: ChildConfig, app: App, writer: ShardWriter, conn: Any, progress: Progress,
                 clock: Any = time.monotonic) -> None:
        self.config, self.app, self.writer, self.conn, self.progress = config, app, writer, conn, progress
        self.clock = clock
        self.queue: deque[ClaimedJob] = deque()
        self.waiting: list[tuple[wire.JobKey, bytes]] = []  # outcomes computed, not yet committed
        self.first_waiting_at = 0.0
        self.stopping = False
        self.started = 0

    def run(self) -> None:
        while not (self.stopping and not self.queue):
            self._receive(block=not self.queue and not self.waiting)
            if self.stopping:
                break
            if self.queue:
                self._run_one(self.queue.popleft())
            if self.waiting and (not self.queue or self._commit_due()):
                self._commit()
        self._commit()
        self.conn.send_bytes(wire.encode(wire.Stopped(tuple((j.id, j.attempt) for j in self.queue))))

    def _receive(self, block: bool) -> None:
        # Block when idle; with only uncommitted outcomes, wait no longer than their commit is due.
        timeout: float | None = 0.0
        if block:
            timeout = None
        elif self.waiting and not self.queue:
            timeout = max(0.0, self.first_waiting_at + self.config.group_commit_max_delay_s - self.clock())
        while self.conn.poll(timeout):
            msg = wire.decode(self.conn.recv_bytes())
            if isinstance(msg, wire.Jobs):
                self.queue.extend(msg.jobs)
            elif isinstance(msg, wire.Stop):
                self.stopping = True
            timeout = 0

    def _run_one(self, job: ClaimedJob) -> None:
        self.started += 1
        self.progress.begin(job.id, self.started)
        started_at = self.clock()
        outcome = run_handler(self.app, job)
        self.progress.end()
        if not self.waiting:
            # The handler's own run time counts toward the group-commit delay: a slow
            # handler's outcome is committed at once, fast ones share one fdatasync.
            self.first_waiting_at = started_at
        self.waiting.append(((job.id, job.attempt), wire.encode_outcome(outcome)))

    def _commit_due(self) -> bool:
        return (len(self.waiting) >= self.config.group_commit_max_records
                or self.clock() - self.first_waiting_at >= self.config.group_commit_max_delay_s)

    def _commit(self) -> None:
        """Make the waiting outcomes durable, then report them; waits out a full disk.

        On a full disk the outcomes stay in memory and are retried every second (the parent
        stops claiming meanwhile). Any other outbox error propagates and ends the child:
        nothing waiting was acknowledged, so those jobs run again under a new attempt.
        """
        warned = False
        while self.waiting:
            for _, payload in self.waiting:
                self.writer.append_bytes(payload)
            try:
                self.writer.commit()
            except OutboxFull as exc:
                if not warned:
                    log.error("%s; holding %d outcomes until space returns", exc, len(self.waiting))
                    warned = True
                time.sleep(1.0)
                continue
            self.conn.send_bytes(wire.encode(wire.Done(tuple(key for key, _ in self.waiting))))
            self.waiting = []


def open_writer(config: ChildConfig, wait_s: float = 30.0) -> ShardWriter:
    """Open this shard's writer, waiting while a dying predecessor or a recovering flusher holds it."""
    return procs.wait_for_lock(lambda: ShardWriter.open(config.outbox_dir, config.shard,
                                                        WriterConfig(segment_bytes=config.segment_bytes)),
                               OutboxLocked, wait_s)


def child_main(config: ChildConfig, conn: Any, progress: Any) -> None:
    """Entry point of a child process (started with spawn)."""
    procs.become_worker_process(config.parent_pid, f"shard-{config.shard}")
    try:
        app = load_app(config.app_ref)
        writer = open_writer(config)
    except Exception as exc:
        conn.send_bytes(wire.encode(wire.Fatal(procs.one_line(exc))))
        os._exit(EXIT_OUTBOX_FAILED)
    try:
        ShardRunner(config, app, writer, conn, Progress(progress)).run()
    except OutboxError as exc:
        log.error("outbox failure, exiting so unacknowledged jobs run again: %s", exc)
        conn.send_bytes(wire.encode(wire.Fatal(procs.one_line(exc))))
        os._exit(EXIT_OUTBOX_FAILED)
    except (EOFError, BrokenPipeError):
        pass  # the parent is gone: acknowledged outcomes are durable, nothing else to do
    writer.close()
