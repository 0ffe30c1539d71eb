"""The parent's housekeeping thread: periodic jobs (and forgetting the schedules no worker
checks any more), waking the jobs whose sleep or wait is over (``shardworker.wake_due``, every
tick, by every worker: a wait ends within a tick of its time), retention (of jobs, and of events), (with metrics) the backlog report, on a connection of its own,
and the watch for queued kinds no live worker serves (``shardworker.worker.unserved``, on
connections of its own).

Both are work no job depends on finishing quickly, so they stay off the dispatcher's
connection and off the heartbeat's (a long prune must never make a live worker look
silent). Each loop checks the schedules (``Scheduler.run_once``: no query unless a tick
is due) and, during a prune round, deletes one batch, so a big prune never delays a tick
by more than a batch. A prune round starts every ``prune_interval_s``; it prunes done jobs
past ``retention_s``, then failed and cancelled ones past ``retention_failed_s`` (kept
longer by default: someone may still look at why), each until a batch comes back short.
With ``backlog_interval_s``, every that often it fetches the backlog report
(``PgStore.backlog_report``: computed by one worker at a time across workers) for the
metrics to show. With the database away it backs off and says so once, and once
again when it is back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from shardworker.core.config import WorkerConfig, duration_text
from shardworker.core.retry import Backoff, Outage, is_retryable
from shardworker.core.schedule import Schedule
from shardworker.core.views import BacklogRow, LimitUse
from shardworker.errors import StoreError
from shardworker.worker.periodic import PeriodicStore, Scheduler
from shardworker.worker.unserved import UnservedWatch

log = logging.getLogger(__name__)

PRUNE_BATCH = 1000
WAKE_BATCH = 1000  # waits ended a call; a full batch is followed at once by the next
# How often the net under send_event and begin_wait looks at the waits for an event begun within
# the last SENT_WITHIN_S (shardworker.wake_sent): a wake-up their race lost comes this late at worst.
WAKE_SENT_EVERY_S = 5.0
SENT_WITHIN_S = 3600.0
BACKLOG_INTERVAL_S = 5.0  # how often one worker recomputes the backlog report the metrics show
FINISHED = ("done", "failed", "cancelled")


class HousekeepingStore(PeriodicStore, Protocol):
    def prune_batch(self, older_than_s: float, limit: int, statuses: Sequence[str]) -> int | None: ...
    def wake_due(self, batch: int) -> int: ...
    def wake_sent(self, within_s: float, batch: int) -> int: ...
    def prune_events(self, older_than_s: float, batch: int) -> int: ...
    def forget_schedules(self, older_than_s: float) -> list[str]: ...
    def backlog_report(self, interval_s: float) -> tuple[float, list[BacklogRow]]: ...
    def limits(self) -> list[LimitUse]: ...
    def close(self) -> None: ...


class Retention(NamedTuple):
    """Jobs of ``statuses`` are pruned once they ended ``older_than_s`` ago (``option`` sets it)."""

    statuses: tuple[str, ...]
    older_than_s: float
    option: str


def retentions(done_s: float, failed_s: float) -> list[Retention]:
    """What a worker prunes, in order: done jobs after ``done_s``, then failed and cancelled
    ones after ``failed_s`` (one pass for all three when the two agree); 0 keeps them."""
    if done_s == failed_s:
        passes = [Retention(FINISHED, done_s, "--retention")]
    else:
        passes = [Retention(("done",), done_s, "--retention"),
                  Retention(("failed", "cancelled"), failed_s, "--retention-failed")]
    return [p for p in passes if p.older_than_s > 0]


def prune(store: HousekeepingStore, older_than_s: float, *, statuses: Sequence[str] = FINISHED,
          batch: int = PRUNE_BATCH, on_batch: Callable[[int], None] | None = None,
          should_stop: Callable[[], bool] = lambda: False) -> int:
    """Delete every job of ``statuses`` finished more than ``older_than_s`` seconds ago,
    ``batch`` rows a transaction, waiting while another worker holds the prune lock; how many."""
    total = 0
    while not should_stop():
        deleted = store.prune_batch(older_than_s, batch, statuses)
        if deleted is None:
            time.sleep(0.1)  # a worker is pruning this very batch's rows; take turns
            continue
        total += deleted
        if on_batch is not None:
            on_batch(total)
        if deleted < batch:
            break
    return total


class Backlog(NamedTuple):
    """A backlog report: its rows, and when it was computed (this process's monotonic clock);
    and the limits across workers with their use, read with it."""

    computed_at: float
    rows: list[BacklogRow]
    limits: list[LimitUse] = []


class Housekeeper:
    """``run_once()`` is one turn of the loop; ``start()`` runs it on a daemon thread."""

    def __init__(self, store: HousekeepingStore, schedules: Sequence[Schedule], retention_s: float,
                 backoff: Backoff, *, retention_failed_s: float | None = None, prune_interval_s: float = 60.0,
                 tick_s: float = 1.0, backlog_interval_s: float | None = None,
                 forget_schedules_s: float = WorkerConfig.periodic_forget_s, unserved: UnservedWatch | None = None,
                 event_retention_s: float = WorkerConfig.event_retention_s,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``retention_s`` for done jobs, ``retention_failed_s`` for failed and cancelled ones
        (None: the same); 0 keeps them. Schedules no worker checked for ``forget_schedules_s``
        are forgotten every ``prune_interval_s``."""
        self.store = store
        self.retentions = retentions(retention_s, retention_s if retention_failed_s is None else retention_failed_s)
        # An unreachable database is told once for the whole worker (shardworker.worker.dbwatch).
        self.outage = Outage("housekeeping (periodic jobs, retention)", log, backoff, floor_s=tick_s, clock=clock,
                             started="{what} paused: {error}; retrying every {delay:.1f}s or so",
                             ended="{what} resumed after {seconds:.1f}s")
        self.scheduler = Scheduler(store, schedules)
        self.prune_interval_s, self.tick_s, self.clock = prune_interval_s, tick_s, clock
        self.pruned = 0
        self._pass, self._pass_total = 0, 0  # the retention a round is at, and what it pruned so far
        self._next_round = clock() + min(5.0, prune_interval_s)  # let startup settle first
        self.forget_schedules_s, self._next_forget = forget_schedules_s, self._next_round
        self.event_retention_s = event_retention_s
        self.woken = 0  # jobs whose sleep or wait this worker ended
        self._waking = False  # the last call ended a full batch: more are due
        self._next_sent_look = 0.0
        self._pruning = False
        self.backlog_interval_s = backlog_interval_s
        self.backlog: Backlog | None = None  # the last report read, for the metrics
        self._next_backlog = 0.0
        self.unserved = unserved
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> float:
        """Check schedules, prune one batch if a round is on; seconds until the next turn."""
        try:
            self._wake_step()
            self.scheduler.run_once()
            if self.unserved is not None:
                self.unserved.run_once()
            self._forget_step()
            self._backlog_step()
            if self.retentions:
                self._prune_step()
        except StoreError as exc:
            if not is_retryable(exc):
                return self._refused(exc)
            return self.outage.failed(exc)
        self.outage.recovered()
        return 0.0 if self._pruning or self._waking else self.tick_s

    def _wake_step(self) -> None:
        """Queue the jobs whose sleep is over or whose wait for an event timed out."""
        woken = self.store.wake_due(WAKE_BATCH)
        self.woken += woken
        self._waking = woken >= WAKE_BATCH
        if self.clock() >= self._next_sent_look:
            self._next_sent_look = self.clock() + WAKE_SENT_EVERY_S
            self.woken += self.store.wake_sent(SENT_WITHIN_S, WAKE_BATCH)

    def _refused(self, exc: StoreError) -> float:
        """The database refuses this turn's work for good (not an outage): say what at ERROR,
        end a prune round, and wait ``prune_interval_s``, not a backoff meant for outages."""
        if self._pruning:
            self._end_round(self.clock())
        log.error("housekeeping (periodic jobs, retention) refused by the database: %s; next try in %gs",
                  exc, self.prune_interval_s)
        return self.prune_interval_s

    def _forget_step(self) -> None:
        """Forget the schedules no worker has checked for ``forget_schedules_s`` (after this
        worker's own were checked: they are never among them)."""
        now = self.clock()
        if now < self._next_forget:
            return
        self._next_forget = now + self.prune_interval_s
        if pruned := self.store.prune_events(self.event_retention_s, PRUNE_BATCH * 10):
            log.info("pruned %d events sent over %s ago (--event-retention)", pruned,
                     duration_text(self.event_retention_s))
        for name in self.store.forget_schedules(self.forget_schedules_s):
            log.info("forgot periodic schedule %r: no worker has checked it for %s (removed from the code?)",
                     name, duration_text(self.forget_schedules_s))

    def _backlog_step(self) -> None:
        now = self.clock()
        if self.backlog_interval_s is None or now < self._next_backlog:
            return
        self._next_backlog = now + self.backlog_interval_s
        age_s, rows = self.store.backlog_report(self.backlog_interval_s)
        self.backlog = Backlog(now - age_s, rows, self.store.limits())

    def _prune_step(self) -> None:
        now = self.clock()
        if not self._pruning:
            if now < self._next_round:
                return
            self._pruning, self._pass, self._pass_total = True, 0, 0
        retention = self.retentions[self._pass]
        deleted = self.store.prune_batch(retention.older_than_s, PRUNE_BATCH, retention.statuses)
        if deleted is None:  # another worker prunes now: its round covers this one
            self._end_round(now)
            return
        self._pass_total += deleted
        self.pruned += deleted
        if deleted < PRUNE_BATCH:
            self._log_pass()
            self._pass, self._pass_total = self._pass + 1, 0
            if self._pass == len(self.retentions):
                self._end_round(now)

    def _log_pass(self) -> None:
        if self._pass_total:
            retention = self.retentions[self._pass]
            log.info("pruned %d %s jobs finished over %s ago (%s)", self._pass_total,
                     " and ".join(", ".join(retention.statuses).rsplit(", ", 1)),
                     duration_text(retention.older_than_s), retention.option)

    def _end_round(self, now: float) -> None:
        if self._pass < len(self.retentions):
            self._log_pass()
        self._pruning, self._pass_total, self._next_round = False, 0, now + self.prune_interval_s

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="shardworker-housekeeping", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        delay = 0.0
        while not self._stop.wait(delay):
            try:
                delay = self.run_once()
            except Exception:  # a bug here must not end periodic jobs for the worker's life
                log.exception("housekeeping failed; trying again in %gs", self.prune_interval_s)
                delay = self.prune_interval_s

    def stop(self, wait_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(wait_s)
            if self._thread.is_alive():
                return  # stuck on a dead connection: the daemon thread ends with the process
        self.store.close()
