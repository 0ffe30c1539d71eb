"""The dispatcher: the parent's loop that claims jobs and routes them to children.

Each ``run_once`` collects what children reported, settles dead children (their lost jobs
get a failure through ``ParentOutcomes``), keeps the flusher alive, and claims due jobs
when there is room: the children hold fewer than their prefetch of jobs, the
flusher is less than ``max_backlog`` outcomes behind, the outbox disk is above its
free-space watermark, and the database answered. (Claims never exceed the room the
children have in all, each child's counted alone: one child stuck on a long handler has
no room, and never stops claims for the others. Jobs go to their home child,
``shard_for(id, N)``; the pool holds back what a child has no room for and gives it to
a child that has.) It then sleeps until a child reports, an enqueue notification arrives,
or the poll interval passes (a few ms while a child comes up or the last outcomes land).

It is built from its collaborators (config, store, pool, flusher, parent outcomes,
clock) and touches nothing else; the heartbeat runs elsewhere, on its own connection.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence

import outbox
from shardworker.core import procs
from shardworker.core.config import WorkerConfig
from shardworker.core.model import ClaimedJob
from shardworker.core.retry import Backoff, Outage
from shardworker.core.routing import shard_for
from shardworker.core.wire import JobKey
from shardworker.errors import NotConnected, Reconnected, SchemaMissing, StoreError
from shardworker.flusher.process import FlusherHandle
from shardworker.worker.backlog import Backlog
from shardworker.worker.cancel_watch import CancelWatch
from shardworker.worker.dbwatch import DatabaseWatch
from shardworker.worker.deaths import Death
from shardworker.worker.dispatch_store import DispatchStore
from shardworker.worker.giveback import GiveBack
from shardworker.worker.parent_outcomes import ParentOutcomes
from shardworker.worker.pool import ChildPool
from shardworker.worker.quarantine_watch import QuarantineWatch
from shardworker.worker.reapply_watch import ReapplyWatch

log = logging.getLogger(__name__)
LOOK_S = 0.05  # how often a pass that will not wait looks for notifications kept during queries
# A worker that reaches a new server holds every worker's claims until each has checked its mark
# there, or at most for as long as a peer may take to reach it too (a silent connection is
# found dead after --network-timeout, then reconnects within the backoff's cap), and this much
# more (shardworker.worker.reapply_watch).
SETTLE_MARGIN_S = 2.0


class ClaimHealth:
    """Whether the database takes this worker's claims: the claims' outage (its backoff, and
    its lines for -v), when the next claim may go, and the failures counted; what the
    dispatcher reports to the watch of the database (``shardworker.worker.dbwatch``)."""

    def __init__(self, backoff: Backoff, clock: Callable[[], float]) -> None:
        self.clock = clock
        # One line per outage comes from the watch; the claim's own lines are for -v.
        self.outage = Outage("claim", log, backoff, started="claim failed ({error}); retrying in {delay:.2f}s",
                             ended=None, clock=clock)
        self.next_claim_at = 0.0  # while failing: not before then
        self.failed_at = 0.0  # when the last claim failed
        self.errors = 0  # claims (and looks) the database failed, in all

    @property
    def ok(self) -> bool:
        """Whether the last claim (or look for notifications) worked."""
        return self.outage.since is None

    @property
    def waiting(self) -> bool:
        return self.clock() < self.next_claim_at

    def failed(self, exc: StoreError) -> None:
        """A claim or a look failed: back off (raises what is not retryable, and SchemaMissing)."""
        if isinstance(exc, SchemaMissing):
            raise exc
        self.next_claim_at = self.clock() + self.outage.failed(exc)
        self.errors += 1
        self.failed_at = self.clock()

    def worked(self) -> None:
        self.outage.recovered()
        self.next_claim_at = 0.0

    def failure(self, flusher: FlusherHandle) -> str | None:
        """Why the database was unreachable for this worker's last claim or flush; None when
        both worked. A claim failure counts until a claim works, or the flusher applies a batch
        begun since (claims may stay paused after an outage: a backlog, no room)."""
        if flusher.failing:
            return flusher.failing
        if self.outage.unreachable and flusher.batch_started_at <= self.failed_at:
            return self.outage.unreachable
        return None


class ClaimDemand:
    """Whether jobs may be waiting beyond what the last claim took, and how soon to look again:
    ``woken`` (a notification, or the poll, since the last claim: jobs may have arrived),
    ``backlog_seen`` (the last claim took all it asked for: more wait), and the pace of a
    rate-limited backlog (come back every ``pace_s`` while it lasts)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.woken, self.backlog_seen = True, False
        self.paced_until, self.pace_s = 0.0, 0.0

    def arrivals(self, low: bool) -> bool:
        """Whether to claim: some child runs ``low``, or jobs arrived while no backlog waits (a
        claim is a transaction, dearer than a step, so not one per job finished)."""
        return low or (self.woken and not self.backlog_seen)

    def claimed(self, took_all: bool, pace_s: float | None) -> None:
        self.backlog_seen, self.woken = took_all, False
        if pace_s is not None:  # a rate-limited backlog: come back as its bucket refills
            self.paced_until, self.pace_s = self.clock() + 1.0, max(0.005, pace_s)

    def wake(self, woken: bool = True) -> None:
        self.woken = self.woken or woken

    def timeout(self, poll_s: float) -> float:
        """How long a wait may last: the poll, or less while a rate-limited backlog is paced."""
        return min(poll_s, self.pace_s) if self.clock() < self.paced_until else poll_s


class Progress:
    """What the worker reports of its work: jobs claimed and jobs done in all, and the periodic
    progress line (every ``interval_s``)."""

    def __init__(self, interval_s: float, clock: Callable[[], float]) -> None:
        self.interval_s, self.clock = interval_s, clock
        self.claimed_total = self.done_total = 0
        self.next_log_at = clock() + interval_s

    def log_if_due(self, in_flight: int, backlog: int) -> None:
        now = self.clock()
        if now >= self.next_log_at:
            self.next_log_at = now + self.interval_s
            log.info("claimed %d, done %d, in flight %d, outbox backlog %d", self.claimed_total, self.done_total,
                     in_flight, backlog)


class Dispatcher:
    """Claim and route; one instance per worker run."""

    def __init__(self, config: WorkerConfig, worker_id: str, kinds: list[str], store: DispatchStore,
                 pool: ChildPool, flusher: FlusherHandle, parent_outcomes: ParentOutcomes, *,
                 stopping: Callable[[], bool], clock: Callable[[], float] = time.monotonic,
                 heard: Callable[[], str] = lambda: "",
                 released: Callable[[], Sequence[str]] = tuple) -> None:
        self.config, self.worker_id, self.kinds, self.store = config, worker_id, kinds, store
        self.pool, self.flusher, self.parent_outcomes = pool, flusher, parent_outcomes
        self.stopping, self.clock = stopping, clock
        # The workers whose slots claims no longer count: watched silent past their
        # --release-slots-after by the heartbeat (shardworker.worker.rescuer).
        self.released = released
        self.health = ClaimHealth(Backoff(config.backoff_base_s, config.backoff_cap_s), clock)
        self.demand = ClaimDemand(clock)
        self.progress = Progress(config.log_interval_s, clock)
        self.pause_reason, self.look_at, self.next_idle_check_at = "", 0.0, 0.0
        self.backlog = Backlog(config.outbox_dir, lambda: flusher.flushed_total, clock)
        self.wake_fds: list[int] = []  # readable when the wait should end at once (a stop signal)
        self.watch = DatabaseWatch(self.backlog, clock)
        self.giving_back = GiveBack(store, worker_id, config.outbox_dir, clock=clock,
                                    backoff=lambda: Backoff(config.backoff_base_s, min(1.0, config.backoff_cap_s)))
        self.cancels = CancelWatch(store, pool, clock)
        still_coming = lambda: [*pool.job_ids(), *parent_outcomes.waiting_ids()]  # noqa: E731
        self.quarantine = QuarantineWatch(config.outbox_dir, worker_id, store, still_coming, clock=clock)
        # A database that went back in time: look before claiming (``heard``: the server the heartbeat reached).
        self.reapply = ReapplyWatch(store, flusher, worker_id, config.outbox_dir, held=pool.held_jobs,
                                    still_coming=still_coming, heard=heard, clock=clock,
                                    settle_s=config.network_timeout_s + config.backoff_cap_s + SETTLE_MARGIN_S,
                                    beat_s=config.heartbeat_interval_s)

    # the loop ----------------------------------------------------------------------

    def run_once(self) -> bool:
        """One pass; True when the worker should exit because it is idle."""
        self.count_finished(self.pool.collect())
        self.backlog.steps_reported(self.pool.job_counts.steps_recorded())  # steps count in the backlog too
        self.settle(self.pool.check())
        self.flusher.check()
        self._settle_quarantined()
        self.backlog.recount_if_drained(quiet=not self.pool.in_flight and self.flusher.idle)
        if self.db_ok and self.clock() >= self.look_at:  # a busy worker claims at every pass, and never waits:
            self.look_at = self.clock() + LOOK_S          # the cancels kept during its claims, every LOOK_S
            self._notified()
        self.cancels.run_once(self.db_ok)
        claimed = self._maybe_claim()
        self.watch.update(self.db_failure())
        self.progress.log_if_due(self.pool.in_flight, self.backlog())
        if self.config.exit_when_idle and self._idle():
            return True
        if not claimed:
            self._wait()
        return False

    def count_finished(self, jobs: int) -> None:
        """Jobs whose outcome is durable now (reported by a child, or settled after its death)."""
        self.backlog.add(jobs)
        self.progress.done_total += jobs

    def settle(self, deaths: list[Death]) -> None:
        """Count a dead child's durable outcomes and fail the started jobs charged for its death
        (``shardworker.worker.blame``: the job that caused it, never a neighbour)."""
        for death in deaths:
            self.parent_outcomes.carry(death.steps)  # ahead of the outcomes below, in the same shard
            self.backlog.add(len(death.steps))
            charged = sum(self.parent_outcomes.fail(jobs, error) for error, jobs in death.charges().items())
            self.count_finished(death.durable + charged + self.parent_outcomes.snooze(death.snoozed))

    def _settle_quarantined(self) -> None:
        try:
            pending = self.quarantine.run_once()
        except StoreError as exc:
            self._claim_failed(exc)  # tried again at the next look
            return
        if pending is not None:  # the quarantined outcomes will never be flushed: count afresh
            self.backlog.reset(pending)

    def db_failure(self) -> str | None:
        """Why the database was unreachable for this worker's last claim or flush (``ClaimHealth.failure``)."""
        return self.health.failure(self.flusher)

    @property
    def db_errors(self) -> int:
        return self.health.errors

    def _claim_blocker(self) -> str:
        if self.stopping():
            return "stopping"
        if not self.parent_outcomes.flush():
            return "the outbox cannot take the outcomes of a dead child yet"
        if self.health.waiting:
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
        targets = [self.pool.target(i) for i in range(len(self.pool))]
        # A child over its share (stuck, or saturated: target 0) has no room; it takes none from the others.
        room = [max(0, t - self.pool.outstanding(i)) for i, t in enumerate(targets)]
        limit = min(self.config.claim_batch, sum(room))
        # Some child runs low: a quarter of its prefetch or less held beyond its run slots.
        prefetch = [max(0, t - self.pool.at_once) for t in targets]
        low = any(r > 0 and r >= p - p // 4 for r, p in zip(room, prefetch, strict=True))
        if limit < 1 or not self.demand.arrivals(low):
            return 0
        if self.pool.held_bytes() >= self.config.claim_bytes:
            return 0  # big payloads wait here for children to take them: claim no more bytes yet
        try:
            self.giving_back.settle_lost_claims()
            self.reapply.run_once()
        except StoreError as exc:
            self._claim_failed(exc)
            return 0
        if self.reapply.blocker():
            return 0
        token = uuid.uuid4().hex
        try:
            claim = self.store.claim_within(self.kinds, self.config.queues, self.worker_id, limit, token,
                                            max_bytes=self.config.claim_bytes, caps=self.pool.cap_rooms(),
                                            run_room=self.pool.run_room(), attempts=self.pool.attempts,
                                            generation=self.reapply.generation, server=self.reapply.server,
                                            released=self.released())
        except Reconnected:
            return 0  # nothing was sent: the next pass looks at the new connection first
        except StoreError as exc:
            if not isinstance(exc, NotConnected):
                self.lost_claims.append(token)  # the server may have committed it before the connection broke
            self._claim_failed(exc)
            return 0
        self.health.worked()
        jobs = claim.jobs
        self.demand.claimed(len(jobs) == limit or sum(j.size for j in jobs) * 2 >= self.config.claim_bytes,
                            claim.pace_s)
        self.progress.claimed_total += len(jobs)
        self._route(jobs)
        return len(jobs)

    def _route(self, jobs: list[ClaimedJob]) -> None:
        by_child: dict[int, list[ClaimedJob]] = {}
        for job in jobs:
            by_child.setdefault(shard_for(job.id, len(self.pool)), []).append(job)
        for index, batch in by_child.items():
            self.pool.send(index, batch)

    @property
    def db_ok(self) -> bool:
        """Whether the last claim (or wait for notifications) worked."""
        return self.health.ok

    def _claim_failed(self, exc: StoreError) -> None:
        self.health.failed(exc)

    def _note_pause(self, blocker: str) -> None:
        if blocker != self.pause_reason and blocker not in ("", "stopping", "database unavailable"):
            log.warning("not claiming: %s", blocker)
        elif not blocker and self.pause_reason not in ("", "database unavailable"):
            log.info("claiming resumed")
        self.pause_reason = blocker

    # waiting and idleness ------------------------------------------------------------

    def _wait(self) -> None:
        timeout = self.demand.timeout(self.config.poll_interval_s)
        if self.health.next_claim_at:
            timeout = max(0.0, min(timeout, self.health.next_claim_at - self.clock()))
        if self.pool.starting or (self.config.exit_when_idle and not self.pool.in_flight and not self.flusher.failing
                                  and (self.backlog() > 0 or not self.flusher.idle)):
            timeout = 0.005  # a child coming up, or the last outcomes landing: neither wakes the wait
        if self.reapply.blocker():
            timeout = min(timeout, 0.01)  # the flusher's check of the mark: nothing wakes the wait for it
        if self.db_ok and self._notified():
            return
        notify_fd = self._notify_fd()  # after the look: a look that failed closed the connection
        reads, writes = self.pool.wait_fds()
        ready = procs.wait_ready([*reads, *self.wake_fds, *([notify_fd] if notify_fd is not None else [])],
                                 writes, min(timeout, 0.2))
        if notify_fd is not None and notify_fd in ready:
            try:
                self.demand.wake(self.store.wait_notify(0))
            except StoreError as exc:
                self._claim_failed(exc)
        elif not ready:
            self.demand.wake()  # the poll: jobs may have fallen due (run_at) meanwhile

    def _notified(self) -> bool:
        """Whether notifications came during the last queries (an enqueue, a cancel): they
        never make the descriptor readable, so look before waiting on it."""
        try:
            notified = self.store.take_notified()
        except StoreError as exc:
            self._claim_failed(exc)
            return False
        self.demand.wake(notified)
        return notified

    def _notify_fd(self) -> int | None:
        if not self.db_ok:
            return None
        try:
            return self.store.notify_fileno()
        except StoreError as exc:
            self._claim_failed(exc)
            return None

    def _idle(self) -> bool:
        if self.pool.in_flight or self.backlog() > 0 or not self.flusher.idle:
            self.next_idle_check_at = 0.0  # the moment all has landed, look at once
            return False
        now = self.clock()
        if now < self.next_idle_check_at:
            return False
        self.next_idle_check_at = now + 0.2
        try:
            # A batch run finishes its retries: those due within the shutdown timeout keep it.
            active = self.store.count_active(self.kinds, self.config.queues, self.worker_id,
                                             retry_horizon_s=self.config.shutdown_timeout_s)
        except StoreError as exc:
            self._claim_failed(exc)
            return False
        return active == 0 and outbox.status(self.config.outbox_dir).pending == 0

    @property
    def claimed_total(self) -> int:
        return self.progress.claimed_total

    @property
    def done_total(self) -> int:
        return self.progress.done_total

    @property
    def lost_claims(self) -> list[str]:
        """Tokens of claims whose reply was lost (given back before the next claim: giveback)."""
        return self.giving_back.lost_claims

    def give_back(self, unstarted: list[JobKey], deadline: float) -> int:
        """At a stop: release jobs no child started and the jobs of lost claims, retrying until
        ``deadline`` (kept for the next start if the database stays away); how many were released."""
        return self.giving_back.at_stop(unstarted, deadline)
