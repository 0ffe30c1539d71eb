"""The supervisor: starts the flusher and the children, recovers at startup, restarts
what dies, and shuts everything down in order.

Startup: take the outbox directory's worker lock, start the flusher, wait until it has
applied every pending outcome, requeue this worker's running jobs that have no outcome
(their handlers never finished), then start the children and dispatch.

Shutdown (SIGTERM/SIGINT): stop claiming, let children finish the job in hand, release
prefetched jobs that never started, let the flusher apply what the database accepts
(bounded by ``shutdown_timeout_s``), exit 0. A second signal exits at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

from outbox import OutboxError, OutboxSyncError, ShardWriter, WriterConfig
from outbox import status as outbox_status
from outbox.fsutil import atomic_write, ensure_dir, try_lock
from shardworker import procs
from shardworker.app import App
from shardworker.children import ChildHandle, acknowledged_in_shard
from shardworker.config import PARENT_SHARD, WorkerConfig
from shardworker.dispatcher import Dispatcher
from shardworker.errors import OutboxBusy, StoreError
from shardworker.flusher import (
    STAT_DRAINED,
    STAT_FLUSHED,
    STAT_IDLE,
    STAT_STOP,
    STAT_WIDTH,
    STOP_NOW,
    STOP_WHEN_IDLE,
    FlusherConfig,
    flusher_main,
)
from shardworker.model import ClaimedJob, Outcome
from shardworker.pg_store import PgStore, StoreConfig
from shardworker.retry import Backoff, is_retryable, job_retry_delay
from shardworker.shard import ChildConfig

log = logging.getLogger(__name__)

WORKER_LOCK = "worker.lock"
WORKER_ID_FILE = "worker-id"


def lock_outbox(directory: str) -> int:
    """Take the directory's worker lock (held for the worker's life); ``OutboxBusy`` if held."""
    ensure_dir(directory)
    fd = try_lock(os.path.join(directory, WORKER_LOCK))
    if fd is None:
        raise OutboxBusy(f"another worker or `outbox drain` holds the outbox {directory}")
    return fd


def resolve_worker_id(directory: str, given: str | None) -> str:
    """``given``, else the id stored in the outbox directory, else a new stored one."""
    path = os.path.join(directory, WORKER_ID_FILE)
    if given:
        return given
    try:
        with open(path, encoding="utf-8") as f:
            stored = f.read().strip()
        if stored:
            return stored
    except FileNotFoundError:
        pass
    new = f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
    atomic_write(directory, WORKER_ID_FILE, new.encode())
    return new


@dataclass
class RunSummary:
    done: int = 0
    pending_outcomes: int = 0
    released: int = 0


class Supervisor:
    """Owns every process of one worker."""

    def __init__(self, config: WorkerConfig, app: App) -> None:
        self.config, self.app = config, app
        self.store_config = StoreConfig(config.dsn, connect_timeout_s=config.connect_timeout_s,
                                        statement_timeout_s=config.statement_timeout_s,
                                        network_timeout_s=config.network_timeout_s)
        self.store = PgStore(self.store_config)
        self.worker_id = ""
        self.stopping = False
        self.children: list[ChildHandle] = []
        self.flusher: Any = None
        self.flusher_stats: Any = None
        self._parent_writer: ShardWriter | None = None
        self._parent_pending: list[Outcome] = []
        self._flusher_restarts = 0
        self.flushed_carry = 0.0  # records flushed by flusher processes that have exited

    # lifecycle -----------------------------------------------------------------

    def run(self) -> RunSummary:
        """Run until stopped (signal) or idle (``exit_when_idle``); returns a summary."""
        lock_fd = lock_outbox(self.config.outbox_dir)
        try:
            self.worker_id = resolve_worker_id(self.config.outbox_dir, self.config.worker_id)
            self._install_signals()
            self._wait_for_schema()
            self._wait_for_writers_gone()
            self._start_flusher()
            self._startup_recovery()
            self._start_children()
            dispatcher = Dispatcher(self)
            while not self.stopping:
                if dispatcher.run_once():
                    break
            return self._shutdown(dispatcher)
        finally:
            self._kill_everything()
            if self._parent_writer is not None:
                self._parent_writer.close()
            self.store.close()
            os.close(lock_fd)

    def _install_signals(self) -> None:
        def on_signal(signum: int, _frame: Any) -> None:
            if self.stopping:
                log.warning("second signal: exiting now; acknowledged outcomes stay in the outbox")
                self._kill_everything()
                os._exit(1)
            log.info("signal %s: stopping (finishing jobs in hand; a second signal exits at once)", signum)
            self.stopping = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def _wait_for_schema(self) -> None:
        """Check the schema, waiting out an unreachable database (but not a missing schema)."""
        self._retry_db("checking the schema", self.store.check_schema)

    def _retry_db(self, what: str, fn: Any) -> Any:
        backoff = Backoff(self.config.backoff_base_s, self.config.backoff_cap_s)
        while True:
            try:
                return fn()
            except StoreError as exc:
                if not is_retryable(exc) or self.stopping:
                    raise
                delay = backoff.next_delay()
                log.warning("%s: %s; retrying in %.1fs", what, exc, delay)
                procs.sleep_until(time.monotonic() + delay, lambda: self.stopping)

    def _wait_for_writers_gone(self, timeout_s: float = 60.0) -> None:
        """Wait until no process still writes a shard of this outbox (children of a worker
        that died a moment ago), so recovery sees every outcome they acknowledged."""
        deadline = time.monotonic() + timeout_s
        for name in sorted(os.listdir(self.config.outbox_dir)):
            if not (name.startswith("shard-") and name.endswith(".lock")):
                continue
            while (fd := try_lock(os.path.join(self.config.outbox_dir, name))) is None:
                if time.monotonic() > deadline or self.stopping:
                    raise OutboxBusy(f"{name} in {self.config.outbox_dir} is still held by another process")
                time.sleep(0.05)
            os.close(fd)

    def _startup_recovery(self) -> None:
        """Apply pending outcomes, then requeue our running jobs that have none."""
        waited_since = time.monotonic()
        while not self.flusher_stats[STAT_DRAINED]:
            self.check_flusher()
            if self.stopping:
                return
            if time.monotonic() - waited_since > 5:
                log.info("waiting for the flusher to apply pending outcomes before claiming")
                waited_since = time.monotonic()
            time.sleep(0.02)
        requeued = self._retry_db("requeueing unfinished jobs", lambda: self.store.requeue_orphans(
            self.worker_id, "worker restarted while the job was running"))
        if requeued:
            log.info("requeued %d jobs this worker was running when it last stopped", len(requeued))

    # processes -------------------------------------------------------------------

    def _start_flusher(self) -> None:
        ctx = procs.context()
        if self.flusher_stats is None:
            self.flusher_stats = ctx.Array("d", STAT_WIDTH, lock=False)
        fcfg = FlusherConfig(self.config.flush_batch, self.config.checkpoint_interval_s,
                             self.config.backoff_base_s, self.config.backoff_cap_s)
        self.flusher = ctx.Process(target=flusher_main, name="shardworker-flusher", daemon=True,
                                   args=(self.config.outbox_dir, self.store_config, fcfg, self.flusher_stats,
                                         self.config.flush_idle_sleep_s, os.getpid()))
        self.flusher.start()

    def check_flusher(self) -> None:
        """Restart the flusher if it died (its counters restart from zero)."""
        if self.flusher.is_alive():
            return
        self._flusher_restarts += 1
        log.error("flusher exited (code %s); restarting it", self.flusher.exitcode)
        self.flushed_carry += self.flusher_stats[STAT_FLUSHED]
        self.flusher_stats[STAT_FLUSHED] = 0
        time.sleep(min(5.0, 0.1 * 2 ** min(self._flusher_restarts, 6)))
        self._start_flusher()

    def _start_children(self) -> None:
        for index in range(self.config.procs):
            handle = ChildHandle(index, ChildConfig(index, self.config.outbox_dir, self.config.app_ref,
                                                    self.config.group_commit_max_delay_s,
                                                    self.config.group_commit_max_records,
                                                    self.config.segment_bytes, os.getpid()))
            handle.start()
            self.children.append(handle)

    def settle_dead_child(self, handle: ChildHandle, reason: str) -> tuple[int, list[ClaimedJob]]:
        """After a child died: its started jobs either have a durable outcome in its shard or
        get a failed one from the parent; returns (jobs settled, jobs it never started)."""
        handle.collect()  # messages it wrote before dying
        handle.process.join(1)
        started, unstarted = handle.split_after_death()
        durable = acknowledged_in_shard(self.config.outbox_dir, handle.config.shard) if started else set()
        lost = [j for j in started if (j.id, j.attempt) not in durable]
        if lost:
            self.write_parent_outcomes([self.died_outcome(j, reason) for j in lost])
            log.error("child %d %s; %d started jobs failed this attempt, %d acknowledged, %d not started",
                      handle.index, reason, len(lost), len(started) - len(lost), len(unstarted))
        handle.sent.clear()
        return len(started), unstarted

    def recover_child(self, handle: ChildHandle, reason: str) -> int:
        """Settle a dead child's jobs, restart it and resend what it never started; returns
        the jobs settled."""
        settled, unstarted = self.settle_dead_child(handle, reason)
        self._restart(handle)
        handle.send(unstarted)
        return settled

    def died_outcome(self, job: ClaimedJob, reason: str) -> Outcome:
        spec = self.app.handlers.get(job.kind)
        delay = spec.delay_after_failure(job.attempt) if spec else job_retry_delay(job.attempt)
        return Outcome(job.id, job.attempt, False, error=reason, retry_delay_s=delay)

    def _restart(self, handle: ChildHandle) -> None:
        lived = time.monotonic() - handle.started_at
        handle.restarts = handle.restarts + 1 if lived < 5 else 0
        if handle.restarts:
            # A child that keeps dying at once (bad app, broken outbox) restarts ever slower;
            # capped at 2 s because this blocks the dispatcher loop.
            time.sleep(min(2.0, 0.1 * 2 ** min(handle.restarts, 5)))
        handle.start()

    def write_parent_outcomes(self, outcomes: list[Outcome]) -> None:
        """Record outcomes the parent decided (a child died or timed out), durably if it can.

        When the outbox cannot take them (a full disk), they wait in memory and
        ``flush_parent_outcomes`` retries; claiming pauses meanwhile.
        """
        self._parent_pending.extend(outcomes)
        self.flush_parent_outcomes()

    def flush_parent_outcomes(self) -> bool:
        """Try to make the parent's waiting outcomes durable; True when none waits."""
        if not self._parent_pending:
            return True
        try:
            if self._parent_writer is None:
                self._parent_writer = ShardWriter.open(self.config.outbox_dir, PARENT_SHARD,
                                                       WriterConfig(segment_bytes=self.config.segment_bytes))
            for outcome in self._parent_pending:
                self._parent_writer.append(outcome.to_wire())
            self._parent_writer.commit()
        except (OutboxError, OSError) as exc:
            log.error("cannot record %d outcomes of dead children yet (%s); retrying",
                      len(self._parent_pending), exc)
            if isinstance(exc, OutboxSyncError) and self._parent_writer is not None:
                self._parent_writer.close()
                self._parent_writer = None
            return False
        self._parent_pending = []
        return True

    # shutdown --------------------------------------------------------------------

    def _shutdown(self, dispatcher: Dispatcher) -> RunSummary:
        deadline = time.monotonic() + self.config.shutdown_timeout_s
        for handle in self.children:
            handle.request_stop()
        unstarted = dispatcher.finish_children(deadline)
        released = self._give_back(unstarted, dispatcher, deadline)
        self._stop_flusher(deadline, dispatcher)
        with contextlib.suppress(StoreError):
            # Kept while jobs stay running under our id, so a rescuer can still find them.
            self.store.forget_worker(self.worker_id)
        pending = outbox_status(self.config.outbox_dir).pending
        if pending:
            log.warning("%d outcomes remain in the outbox %s; they apply at the next start, or run "
                        "`shardworker outbox drain --outbox-dir %s`", pending, self.config.outbox_dir,
                        self.config.outbox_dir)
        return RunSummary(dispatcher.done_total, pending, released)

    def _give_back(self, unstarted: list[tuple[int, int]], dispatcher: Dispatcher, deadline: float) -> int:
        """Release unstarted jobs and settle lost claims, retrying until the deadline."""
        backoff = Backoff(self.config.backoff_base_s, min(1.0, self.config.backoff_cap_s))
        released = 0
        while True:
            try:
                released += self.store.release(unstarted, self.worker_id) if unstarted else 0
                unstarted = []
                if dispatcher.settle_lost_claims():
                    return released
            except StoreError as exc:
                if time.monotonic() + backoff.base_s >= deadline or not is_retryable(exc):
                    log.warning("could not give back %d unstarted jobs (%s); they stay running under "
                                "worker %s until its next start, or a rescue", len(unstarted), exc, self.worker_id)
                    return 0
            procs.sleep_until(min(deadline, time.monotonic() + backoff.next_delay()), lambda: False)

    def _stop_flusher(self, deadline: float, dispatcher: Dispatcher) -> None:
        self.flusher_stats[STAT_STOP] = STOP_WHEN_IDLE
        while time.monotonic() < deadline and self.flusher.is_alive():
            if dispatcher.backlog() <= 0 and self.flusher_stats[STAT_IDLE]:
                break
            time.sleep(0.02)
        self.flusher_stats[STAT_STOP] = STOP_NOW
        procs.join_or_kill(self.flusher, 10)

    def _kill_everything(self) -> None:
        for handle in self.children:
            if handle.alive:
                procs.kill_quietly(handle.process.pid)
        if self.flusher is not None and self.flusher.is_alive():
            procs.kill_quietly(self.flusher.pid)


__all__ = ["RunSummary", "Supervisor", "lock_outbox", "resolve_worker_id"]
