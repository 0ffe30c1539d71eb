"""The dispatcher: the parent's loop that claims jobs and routes them to children.

Each ``run_once`` collects what children reported, handles deaths and handler timeouts,
heartbeats, and claims due jobs when there is room: a child has fewer than
``prefetch_per_child`` jobs in flight, the flusher is less than ``max_backlog`` outcomes
behind, the outbox disk is above its free-space watermark, and the database answered.
It then sleeps until a child reports, an enqueue notification arrives, or the poll
interval passes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from typing import TYPE_CHECKING

from multiprocess.connection import wait as wait_ready

import outbox
from shardworker.errors import SchemaMissing, StoreError
from shardworker.flusher import STAT_FLUSHED, STAT_IDLE
from shardworker.model import ClaimedJob
from shardworker.rescuer import Rescuer
from shardworker.retry import Backoff, is_retryable
from shardworker.routing import shard_for

if TYPE_CHECKING:
    from shardworker.children import ChildHandle
    from shardworker.supervisor import Supervisor

log = logging.getLogger(__name__)


class Dispatcher:
    """Claim and route; one instance per worker run."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup, self.config = sup, sup.config
        self.kinds = sup.app.kinds
        self.backoff = Backoff(self.config.backoff_base_s, self.config.backoff_cap_s)
        self.next_claim_at = 0.0
        self.acked_total = 0  # outcomes acknowledged since the flusher's counters started
        self.flushed_base = sup.flushed_carry + sup.flusher_stats[STAT_FLUSHED]
        self.done_total = 0
        self.claimed_total = 0
        self.pause_reason = ""
        self.more_due = True
        self.next_heartbeat_at = 0.0
        self.next_log_at = time.monotonic() + self.config.log_interval_s
        self.next_idle_check_at = 0.0
        self.db_ok = True
        self.lost_claims: list[str] = []
        self.heartbeat_backoff = Backoff(self.config.backoff_base_s, self.config.backoff_cap_s)
        self.rescuer = Rescuer(sup.store, sup.worker_id, self.config.rescue_after_s)

    # the loop ----------------------------------------------------------------------

    def run_once(self) -> bool:
        """One pass; True when the worker should exit because it is idle."""
        self._collect()
        self._check_children()
        self.sup.check_flusher()
        self._heartbeat()
        claimed = self._maybe_claim()
        self._log_progress()
        if self.config.exit_when_idle and self._idle():
            return True
        if not claimed:
            self._wait()
        return False

    def _collect(self) -> None:
        for handle in self.sup.children:
            self._count_finished(len(handle.collect()))

    def _count_finished(self, jobs: int) -> None:
        """Jobs whose outcome is durable now (reported by a child, or settled after its death)."""
        self.acked_total += jobs
        self.done_total += jobs

    def _check_children(self) -> None:
        now = time.time()
        for handle in self.sup.children:
            if handle.alive:
                self._check_timeout(handle, now)
                continue
            reason = handle.fatal or f"worker process died (exit code {handle.process.exitcode})"
            self._count_finished(self.sup.recover_child(handle, reason))

    def _check_timeout(self, handle: ChildHandle, now: float) -> None:
        current = handle.current_job()
        if current is None:
            return
        job, started = current
        spec = self.sup.app.handlers.get(job.kind)
        if spec is None or spec.timeout_s is None or now - started <= spec.timeout_s:
            return
        log.error("job %d (%s) exceeded its %.1fs timeout; killing child %d", job.id, job.kind,
                  spec.timeout_s, handle.index)
        os.kill(handle.process.pid, 9)
        handle.process.join(5)
        self._count_finished(self.sup.recover_child(handle, f"timed out after {spec.timeout_s:g}s"))

    # claiming ------------------------------------------------------------------------

    def backlog(self) -> int:
        """Outcomes acknowledged by children and not yet flushed (an estimate)."""
        flushed = self.sup.flushed_carry + self.sup.flusher_stats[STAT_FLUSHED] - self.flushed_base
        return int(self.acked_total - flushed)

    def _claim_blocker(self) -> str:
        if self.sup.stopping:
            return "stopping"
        if not self.sup.flush_parent_outcomes():
            return "the outbox cannot take the outcomes of a dead child yet"
        if time.monotonic() < self.next_claim_at:
            return "database unavailable"
        if self.backlog() > self.config.max_backlog:
            return f"the flusher is {self.backlog()} outcomes behind (max_backlog {self.config.max_backlog})"
        free = outbox.free_bytes(self.config.outbox_dir)
        if free < self.config.min_free_bytes:
            return (f"the outbox disk is nearly full ({free // 1024 // 1024} MiB free, "
                    f"watermark {self.config.min_free_bytes // 1024 // 1024} MiB)")
        return ""

    def _maybe_claim(self) -> int:
        blocker = self._claim_blocker()
        self._note_pause(blocker)
        if blocker:
            return 0
        room = {h.index: self.config.prefetch_per_child - len(h.sent) for h in self.sup.children}
        limit = min(self.config.claim_batch, sum(max(0, r) for r in room.values()))
        # Skip tiny claims while every child still has a quarter of its prefetch queued.
        if limit < 1 or (min(room.values()) < self.config.prefetch_per_child // 4 * 3 and not self.more_due):
            return 0
        try:
            if not self.settle_lost_claims():
                return 0
        except StoreError as exc:
            self._claim_failed(exc)
            return 0
        token = uuid.uuid4().hex
        try:
            jobs = self.sup.store.claim(self.kinds, self.config.queues, self.sup.worker_id, limit, token)
        except StoreError as exc:
            # The server may have committed the claim before the connection broke.
            self.lost_claims.append(token)
            self._claim_failed(exc)
            return 0
        self._claim_ok()
        self.more_due = len(jobs) == limit
        self.claimed_total += len(jobs)
        self._route(jobs)
        return len(jobs)

    def settle_lost_claims(self) -> bool:
        """Give back jobs of claims whose replies were lost; True once none is left.

        Raises ``StoreError`` when the database fails meanwhile (the token is kept).
        """
        while self.lost_claims:
            released = self.sup.store.release_claim(self.lost_claims[0], self.sup.worker_id)
            if released:
                log.warning("gave back %d jobs of a claim whose reply was lost", released)
            self.lost_claims.pop(0)
        return True

    def _route(self, jobs: list[ClaimedJob]) -> None:
        by_child: dict[int, list[ClaimedJob]] = {}
        for job in jobs:
            by_child.setdefault(shard_for(job.id, self.config.procs), []).append(job)
        for index, batch in by_child.items():
            handle = self.sup.children[index]
            try:
                handle.send(batch)
            except (OSError, EOFError):
                handle.sent.extend(batch)  # the child is dead: these count as never started, resent after restart

    def _claim_failed(self, exc: StoreError) -> None:
        if isinstance(exc, SchemaMissing) or not is_retryable(exc):
            raise exc
        delay = self.backoff.next_delay()
        self.next_claim_at = time.monotonic() + delay
        self.rescuer.connection_lost()
        if self.db_ok or self.backoff.failures % 10 == 0:
            log.warning("claim failed (%s); children finish what they hold, outcomes wait in the "
                        "outbox; retrying in %.2fs", exc, delay)
        self.db_ok = False

    def _claim_ok(self) -> None:
        if not self.db_ok:
            log.info("database reachable again; claiming resumed")
        self.db_ok = True
        self.backoff.reset()
        self.next_claim_at = 0.0

    def _note_pause(self, blocker: str) -> None:
        if blocker != self.pause_reason and blocker not in ("", "stopping", "database unavailable"):
            log.warning("not claiming: %s", blocker)
        elif not blocker and self.pause_reason not in ("", "database unavailable"):
            log.info("claiming resumed")
        self.pause_reason = blocker

    # waiting, heartbeats, idleness -------------------------------------------------

    def _wait(self) -> None:
        timeout = self.config.poll_interval_s
        if self.next_claim_at:
            timeout = max(0.0, min(timeout, self.next_claim_at - time.monotonic()))
        conns = [h.conn for h in self.sup.children if h.alive]
        notify_fd = self._notify_fd()
        ready = wait_ready([*conns, notify_fd] if notify_fd is not None else conns, timeout=min(timeout, 0.2))
        if notify_fd is not None and notify_fd in ready:
            with contextlib.suppress(StoreError):
                self.more_due = self.sup.store.wait_notify(0) or self.more_due
        elif not ready:
            self.more_due = True  # poll fallback: maybe jobs became due (run_at) meanwhile

    def _notify_fd(self) -> int | None:
        if not self.db_ok:
            return None
        try:
            if not self.sup.store.listening:
                self.sup.store.listen()
            return self.sup.store.connection().fileno()
        except StoreError:
            return None

    def _heartbeat(self) -> None:
        """Beat on its own timer, whatever claiming is doing: a worker that merely cannot
        claim (full disk, busy children, flusher behind) must not look dead to rescuers."""
        now = time.monotonic()
        if now < self.next_heartbeat_at:
            return
        try:
            self.sup.store.heartbeat(self.sup.worker_id, socket.gethostname(), os.getpid())
            self.heartbeat_backoff.reset()
            self.next_heartbeat_at = now + self.config.heartbeat_interval_s
            self.rescuer.run_once(now)
        except StoreError as exc:
            self.rescuer.connection_lost()
            delay = max(self.config.heartbeat_interval_s, self.heartbeat_backoff.next_delay())
            self.next_heartbeat_at = now + delay
            log.debug("heartbeat failed: %s", exc)

    def _idle(self) -> bool:
        if any(h.sent for h in self.sup.children) or self.backlog() > 0 or not self.sup.flusher_stats[STAT_IDLE]:
            return False
        now = time.monotonic()
        if now < self.next_idle_check_at:
            return False
        self.next_idle_check_at = now + 0.2
        try:
            active = self.sup.store.count_active(self.kinds, self.config.queues, self.sup.worker_id)
        except StoreError:
            return False
        return active == 0 and outbox.status(self.config.outbox_dir).pending == 0

    def _log_progress(self) -> None:
        now = time.monotonic()
        if now >= self.next_log_at:
            self.next_log_at = now + self.config.log_interval_s
            log.info("claimed %d, done %d, in flight %d, outbox backlog %d", self.claimed_total,
                     self.done_total, sum(len(h.sent) for h in self.sup.children), self.backlog())

    def finish_children(self, deadline: float) -> list[tuple[int, int]]:
        """After stop requests: wait for children to finish (or kill them at the deadline);
        returns the (id, attempt) of jobs they never started."""
        unstarted: list[tuple[int, int]] = []
        for handle in self.sup.children:
            while not handle.stopped and handle.alive and time.monotonic() < deadline:
                wait_ready([handle.conn], timeout=0.1)
                self._collect()
            self._collect()
            if handle.stopped:
                unstarted.extend(handle.unstarted)
                handle.process.join(5)
                continue
            # Out of time, or it died: settle what it held without restarting it.
            if handle.alive:
                os.kill(handle.process.pid, 9)
                handle.process.join(5)
            settled, never = self.sup.settle_dead_child(handle, "shutdown timeout")
            self._count_finished(settled)
            unstarted.extend((j.id, j.attempt) for j in never)
        return unstarted
