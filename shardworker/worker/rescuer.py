"""The rescuer: requeues the running jobs of workers that went silent.

Every worker's heartbeat thread runs one, and no lock picks one of them: a lock held for a
session would be held by a worker that froze (a hung host, a paused VM keep their sessions
open), and then no one would ever be rescued. Rescuers that act at once are harmless: a
rescue removes a silent worker's row only if its heartbeat is the one watched, and requeues
only the jobs of rows it removed, so one of them does it and the others find nothing. A
rescuer rescues a worker only after *watching* its heartbeat stay unchanged for
``rescue_after_s`` while the rescuer itself stayed connected: silence the rescuer did not
witness proves nothing; and only if the heartbeat is still the one it watched when the
rescue runs; and only after the silent worker's own ``--rescue-after`` too, when it is the
longer (its row says it), so a peer started with a short window rescues no one sooner than
they asked. A gap between two looks longer than ``max_gap_s`` (this host was paused) starts
every watch again: peers paused with it, or cut off from it, had no chance to beat. Rescued jobs
wait ``grace_s`` before they may be claimed again: the silent worker's late outcomes of
those attempts still apply meanwhile.
So a database outage, which silences every worker at once (the rescuer included),
rescues nobody when it ends; only a worker that stayed silent while this one kept
beating is rescued. Losing the connection forgets every observation.

The same watch releases slots sooner: a worker watched silent for ``release_after_s`` (or
its own ``--release-slots-after`` when longer) is in ``released``, and this worker's claims
stop counting its running jobs toward limits across workers (global_concurrency, a queue's
concurrency). Its jobs stay its own until the rescue: nothing runs them again meanwhile.
A rescue the database refuses for good (``DataRejected``: retrying would fail the same
way) is told at ERROR and set aside: those workers are not tried again until they beat
again or this worker restarts; a lost connection is raised, for the heartbeat to retry.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Protocol

from shardworker.core.retry import is_retryable
from shardworker.core.views import Rescued, Watched
from shardworker.errors import StoreError

log = logging.getLogger(__name__)


class RescueStore(Protocol):
    generation: int  # changes whenever the store opened a new database session

    def rescue_watch(self) -> dict[str, Watched]: ...
    def rescue_workers(self, observed: list[tuple[str, datetime]], grace_s: float = 0.0) -> Rescued: ...


class Rescuer:
    """Call ``run_once(now)`` after each successful heartbeat; ``now`` is monotonic seconds."""

    def __init__(self, store: RescueStore, worker_id: str, rescue_after_s: float, grace_s: float = 0.0,
                 max_gap_s: float | None = None, release_after_s: float | None = None) -> None:
        self.store, self.worker_id, self.rescue_after_s, self.grace_s = store, worker_id, rescue_after_s, grace_s
        self.max_gap_s = max_gap_s  # a longer gap between two looks (this host paused): watch afresh
        self.release_after_s = release_after_s  # None: release no slots before the rescue
        # Workers watched silent past their slots' release, as of the last look (replaced whole:
        # the dispatcher reads it from another thread).
        self.released: tuple[str, ...] = ()
        self._seen: dict[str, tuple[datetime, float]] = {}  # worker -> (heartbeat, first seen at)
        self._refused: dict[str, datetime] = {}  # worker -> the heartbeat whose rescue was refused
        self._generation = -1
        self._looked_at: float | None = None

    def connection_lost(self) -> None:
        """Forget all observations: silence during our own outage proves nothing."""
        self._seen.clear()
        self.released = ()

    def run_once(self, now: float) -> list[int]:
        """Observe heartbeats; rescue workers watched silent long enough. Returns job ids."""
        if self.store.generation != self._generation:
            self.connection_lost()  # a new session: our watching ended
            self._generation = self.store.generation
        if self.max_gap_s is not None and self._looked_at is not None and now - self._looked_at > self.max_gap_s:
            self.connection_lost()  # this host was paused: its peers had no chance to beat meanwhile
        took = time.monotonic()
        try:
            return self._look(now, took)
        finally:  # the gap runs from the end of this look: a slow look is no pause
            self._looked_at = now + time.monotonic() - took

    def _look(self, now: float, took: float) -> list[int]:
        watch = self.store.rescue_watch()
        # A beat is first seen when the answer came, not when this look began (a slow beat or query
        # before it would date the watch too early); the watch is measured from there to a look's start.
        seen_at = now + time.monotonic() - took
        if self.store.generation != self._generation:
            self.connection_lost()  # reconnected inside that call: start watching afresh
            self._generation = self.store.generation
            return []
        silent: list[tuple[str, datetime]] = []
        released: list[str] = []
        for worker, (beat, theirs, their_slots) in watch.items():
            if worker == self.worker_id:
                continue
            seen = self._seen.get(worker)
            if seen is None or seen[0] != beat:
                self._seen[worker] = (beat, seen_at)
                continue
            if self.release_after_s is not None and their_slots is not None \
                    and now - seen[1] >= max(self.release_after_s, their_slots):
                released.append(worker)
            if self._refused.get(worker) != beat and now - seen[1] >= max(self.rescue_after_s, theirs or 0.0):
                silent.append((worker, beat))  # the longer window counts
        self.released = tuple(sorted(released))
        for gone in set(self._seen) - set(watch):
            del self._seen[gone]
        for gone in set(self._refused) - set(watch):
            del self._refused[gone]
        if not silent:
            return []
        for worker, _ in silent:
            self._seen.pop(worker, None)
        rescued = self._rescue(silent)
        if rescued.workers:  # else a peer rescued them first (or the database refused: told)
            log.warning("rescued %d jobs of silent workers %s (claimable again in %gs)", len(rescued.jobs),
                        ", ".join(sorted(rescued.workers)), self.grace_s)
        return rescued.jobs

    def _rescue(self, silent: list[tuple[str, datetime]]) -> Rescued:
        """Rescue ``silent`` in one statement; if the database refuses it for good, each
        worker alone, so one worker's refused rescue holds back no other's."""
        if len(silent) == 1:
            return self._rescue_alone(silent[0])
        try:
            return self.store.rescue_workers(silent, self.grace_s)
        except StoreError as exc:
            if is_retryable(exc):
                raise
        alone = [self._rescue_alone(one) for one in silent]
        return Rescued(tuple(w for r in alone for w in r.workers), [job for r in alone for job in r.jobs])

    def _rescue_alone(self, silent: tuple[str, datetime]) -> Rescued:
        try:
            return self.store.rescue_workers([silent], self.grace_s)
        except StoreError as exc:
            if is_retryable(exc):
                raise
            self._set_aside(silent, exc)
            return Rescued((), [])

    def _set_aside(self, silent: tuple[str, datetime], exc: StoreError) -> None:
        """The database refuses this worker's rescue for good: say so, and stop trying until
        it beats again (or this worker restarts)."""
        self._refused[silent[0]] = silent[1]
        log.error("cannot rescue the jobs of silent worker %s: %s; set aside, not tried again until it beats "
                  "again or this worker restarts", silent[0], exc)
