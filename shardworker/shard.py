"""The child process: runs handlers and appends outcomes to its own outbox shard.

A child never holds a database connection. It receives batches of claimed jobs from the
parent over a pipe, runs each handler, appends the outcome to its shard, and commits
(one write, one fdatasync) when the batch is done, when ``group_commit_max_records``
outcomes wait, or when the oldest waiting outcome is ``group_commit_max_delay_s`` old,
so a slow handler's result is durable right away. Only after the commit does it report
the jobs finished.

Wire messages are orjson lists: parent -> child ``["jobs", [[id, kind, queue, payload,
attempt, max_attempts], ...]]`` and ``["stop"]``; child -> parent ``["done", [id, ...]]``,
``["stopped", [[id, attempt], ...]]`` (jobs never started) and ``["fatal", message]``.
The shared ``slot`` holds [current job id, start time in ms, jobs started so far].
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
from outbox.frame import MAX_PAYLOAD_BYTES
from shardworker import procs
from shardworker.app import App, load_app
from shardworker.model import ClaimedJob, Outcome

log = logging.getLogger(__name__)

SLOT_JOB, SLOT_STARTED_MS, SLOT_STARTED_COUNT = 0, 1, 2
SLOT_WIDTH = 3
EXIT_OUTBOX_FAILED = 3  # the child exits with this when its outbox cannot take outcomes


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

    def __init__(self, config: ChildConfig, app: App, writer: ShardWriter, conn: Any, slot: Any) -> None:
        self.config, self.app, self.writer, self.conn, self.slot = config, app, writer, conn, slot
        self.queue: deque[ClaimedJob] = deque()
        self.waiting: list[tuple[int, bytes]] = []  # (id, outcome) computed, not yet committed
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
        unstarted = [[j.id, j.attempt] for j in self.queue]
        self.conn.send_bytes(orjson.dumps(["stopped", unstarted]))

    def _receive(self, block: bool) -> None:
        # Block when idle; with only uncommitted outcomes, wait no longer than their commit is due.
        timeout: float | None = 0.0
        if block:
            timeout = None
        elif self.waiting and not self.queue:
            timeout = max(0.0, self.first_waiting_at + self.config.group_commit_max_delay_s - time.monotonic())
        while self.conn.poll(timeout):
            msg = orjson.loads(self.conn.recv_bytes())
            if msg[0] == "jobs":
                self.queue.extend(ClaimedJob(*j) for j in msg[1])
            elif msg[0] == "stop":
                self.stopping = True
            timeout = 0

    def _run_one(self, job: ClaimedJob) -> None:
        self.started += 1
        self.slot[SLOT_JOB], self.slot[SLOT_STARTED_MS] = job.id, int(time.time() * 1000)
        self.slot[SLOT_STARTED_COUNT] = self.started
        started_at = time.monotonic()
        outcome = run_handler(self.app, job)
        self.slot[SLOT_JOB] = 0
        if not self.waiting:
            # The handler's own run time counts toward the group-commit delay: a slow
            # handler's outcome is committed at once, fast ones share one fdatasync.
            self.first_waiting_at = started_at
        record = orjson.dumps(outcome.to_wire())
        if len(record) > MAX_PAYLOAD_BYTES:
            too_big = Outcome(job.id, job.attempt, False, retry_delay_s=-1.0,
                              error=f"handler result too large: {len(record)} bytes > {MAX_PAYLOAD_BYTES}")
            record = orjson.dumps(too_big.to_wire())
        self.waiting.append((job.id, record))

    def _commit_due(self) -> bool:
        return (len(self.waiting) >= self.config.group_commit_max_records
                or time.monotonic() - self.first_waiting_at >= self.config.group_commit_max_delay_s)

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
            self.conn.send_bytes(orjson.dumps(["done", [job_id for job_id, _ in self.waiting]]))
            self.waiting = []


def open_writer(config: ChildConfig, wait_s: float = 30.0) -> ShardWriter:
    """Open this shard's writer, waiting while a dying predecessor or a recovering flusher holds it."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return ShardWriter.open(config.outbox_dir, config.shard, WriterConfig(segment_bytes=config.segment_bytes))
        except OutboxLocked:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def child_main(config: ChildConfig, conn: Any, slot: Any) -> None:
    """Entry point of a child process (started with spawn)."""
    # A child must not outlive its parent: an orphan finishing a job after a restarted
    # worker requeued it would make that job run twice.
    procs.die_with_parent()
    if os.getppid() != config.parent_pid:
        os._exit(1)  # the parent died before the death signal was armed
    # The parent coordinates shutdown: a terminal's Ctrl-C must not kill children mid-job.
    procs.ignore_stop_signals()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s shard-{config.shard} %(levelname)s %(message)s")
    try:
        app = load_app(config.app_ref)
        writer = open_writer(config)
    except Exception as exc:
        conn.send_bytes(orjson.dumps(["fatal", f"{type(exc).__name__}: {exc}"]))
        os._exit(EXIT_OUTBOX_FAILED)
    try:
        ShardRunner(config, app, writer, conn, slot).run()
    except OutboxError as exc:
        log.error("outbox failure, exiting so unacknowledged jobs run again: %s", exc)
        conn.send_bytes(orjson.dumps(["fatal", str(exc)]))
        os._exit(EXIT_OUTBOX_FAILED)
    except (EOFError, BrokenPipeError):
        pass  # the parent is gone: acknowledged outcomes are durable, nothing else to do
    writer.close()
