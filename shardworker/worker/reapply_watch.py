"""The parent's side of a database that comes back older (the flusher's is
``shardworker.flusher.marks``): claim nothing on a database that may have gone back in time
until what this worker applied is there, or landing again.

* Whenever the dispatcher's connection is new (a reconnect after an outage, a failover), it
  asks the flusher to check the outbox's mark (``FlusherHandle.check_mark``) and claims
  nothing until that check is done and nothing is being re-applied. A claim on a connection
  made since the last look is refused (``claim_within(generation=...)``), and so is one on
  another server than the one looked at (``server``: a pooler may move to a new server under
  the same connection; the heartbeat then tells of it within a beat).
* When the server is another than before (its start time or the database's oid changed: a
  failover, a restore, a restart; the dispatcher's reconnect or a heartbeat sees it), it also
  holds every worker's claims (``claim_settle``) until each worker that was beating around
  the database's latest state, and each already on the new server, has said it checked its
  own mark there (``worker_checked``: every worker says so after each check), or for
  ``settle_s`` at most (a worker that is down never says so). A worker whose mark is behind
  holds claims on until it has re-applied. Then it claims again the jobs its children hold
  whose claims the database lost (``job_reclaim``), so no other worker claims them meanwhile.
* Once a re-apply is over and the flusher idle, the jobs still running for this worker that it
  does not hold and whose outcomes are nowhere in the outbox went back with the database past
  the kept tail: they are requeued, charged an attempt (``lost.jsonl`` names them), instead of
  staying ``running`` until this worker stops.

The look at a new connection or server is done whole, or tried again whole at the next pass:
until it is, nothing is claimed. Every call may raise ``StoreError``: the dispatcher retries it
as it retries a claim.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from shardworker.core.model import ClaimedJob
from shardworker.flusher.process import FlusherHandle
from shardworker.worker.quarantine_watch import pending_job_ids, record_lost

log = logging.getLogger(__name__)

LOST_REASON = ("outcome lost: the database went back in time further than the outbox keeps "
               "(--reapply-window), to before this attempt's outcome landed")
SETTLE_LOOK_S = 0.2  # how often a new server's hold asks whether every worker has checked


class WatchStore(Protocol):
    generation: int

    def connection(self) -> object: ...
    def server_identity(self) -> str: ...
    def settle_hold(self, holder: str, reason: str, seconds: float, server: str, window_s: float) -> None: ...
    def settle_end(self, holder: str) -> list[str]: ...
    def worker_checked(self, worker_id: str, server: str) -> bool: ...
    def reclaim(self, worker_id: str, jobs: Sequence[ClaimedJob]) -> list[int]: ...
    def requeue_lost(self, worker_id: str, error: str, keep_ids: Sequence[int]) -> list[int]: ...


class ReapplyWatch:
    """Call ``run_once()`` before each claim, then claim only when ``blocker()`` is ""."""

    def __init__(self, store: WatchStore, flusher: FlusherHandle, worker_id: str, outbox_dir: str, *,
                 held: Callable[[], list[ClaimedJob]], still_coming: Callable[[], Iterable[int]],
                 heard: Callable[[], str], settle_s: float, beat_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.flusher, self.worker_id, self.outbox_dir = store, flusher, worker_id, outbox_dir
        self.held, self.still_coming, self.heard = held, still_coming, heard
        self.settle_s, self.beat_s, self.clock = settle_s, beat_s, clock
        self.generation = -1  # the dispatcher's connection last looked at: claims go on that one only
        self.server: str | None = None  # the server last looked at (server_identity): claims go there only
        self._heard = ""  # the server the heartbeat said last
        self._asked: int | None = None  # the flusher's check awaited
        self._checked: str | None = None  # the server this worker said it checked, once the check is done
        self._reclaim = False  # a new server: claim again what the children hold, once checked
        self._settling: tuple[str, float] | None = None  # (server, until) of this worker's hold for a new server
        self._settle_look_at = 0.0
        self._waiting_for: list[str] = []  # the workers that hold has not heard from yet
        self._regressions = 0  # re-applies seen so far
        self._settle_lost = False  # one ended: requeue what went back past the kept tail, once idle

    def blocker(self) -> str:
        if self._asked is not None:
            return "checking that the database still holds what this worker applied"
        if self.flusher.reapplying:
            return "re-applying what the database lost when it went back in time"
        if self._settling is not None:
            return f"waiting for {len(self._waiting_for) or 'every'} worker(s) to check the new database server"
        return ""

    def run_once(self) -> None:
        self.store.connection()  # opened now if it was lost: a new one is looked at before any claim
        if self.store.generation != self.generation:
            self._look(self.store.server_identity())
            self.generation = self.store.generation
        heard = self.heard()
        if heard and heard != self._heard:  # the heartbeat's own news only: it may lag the dispatcher's look
            self._look(heard)
            self._heard = heard
        if self._asked is not None and self.flusher.mark_checked(self._asked):
            self._asked = None
        if self._asked is None and not self.flusher.reapplying and self.server is not None:
            self._after_check(self.server)
        self._settle()
        regressions = self.flusher.counters()["regressions"]
        if regressions > self._regressions:
            self._regressions, self._settle_lost = regressions, True
        if self._settle_lost and self._asked is None and not self.flusher.reapplying and self.flusher.idle:
            self._requeue_lost()

    def _look(self, identity: str) -> None:
        """A new connection, or the heartbeat's news of a server: have the flusher check, and on
        a new server (after a known one, which may hold an older database) hold every worker's
        claims until each has checked. ``server`` moves only once that is all asked."""
        if identity and self.server is not None and identity != self.server:
            self.store.settle_hold(f"settle:{self.worker_id}", f"worker {self.worker_id} reached a new server",
                                   self.settle_s, identity, 3 * self.beat_s)
            self._settling, self._waiting_for = (identity, self.clock() + self.settle_s), []
            self._reclaim = True
            log.info("reached a new database server (a restart, a failover or a restore): every worker's claims are "
                     "held until each has checked that the database still holds what it applied (%.0fs at most)",
                     self.settle_s)
        self._asked = self.flusher.check_mark()
        self.server = identity or self.server

    def _after_check(self, server: str) -> None:
        """The flusher has checked the mark on ``server`` and re-applies nothing: claim again what
        the children hold (after a new server), and say so to the other workers."""
        if self._reclaim:
            held = self.held()
            again = self.store.reclaim(self.worker_id, held)
            self._reclaim = False
            if again:
                log.warning("claimed again %d jobs this worker's children hold, whose claims the database lost when "
                            "it went back in time", len(again))
        if self._checked != server and self.store.worker_checked(self.worker_id, server):
            self._checked = server

    def _settle(self) -> None:
        """While this worker holds claims for a new server: end the hold once every worker it
        waits for has checked there (or let it lapse at its time)."""
        if self._settling is None or self.clock() < self._settle_look_at:
            return
        self._settle_look_at = self.clock() + SETTLE_LOOK_S
        if self.clock() >= self._settling[1]:
            log.warning("claims resume: %s did not check the new database server within %.0fs (down, or cut off); "
                        "a job whose claim the database lost with it may run again", ", ".join(self._waiting_for)
                        or "a worker", self.settle_s)
            self._settling = None
            return
        self._waiting_for = self.store.settle_end(f"settle:{self.worker_id}")
        if not self._waiting_for:
            self._settling = None

    def _requeue_lost(self) -> None:
        keep = {j.id for j in self.held()} | set(self.still_coming()) | set(pending_job_ids(self.outbox_dir))
        requeued = self.store.requeue_lost(self.worker_id, LOST_REASON, sorted(keep))
        self._settle_lost = False
        if requeued:
            log.error("%d running jobs requeued, charged an attempt: %s", len(requeued), LOST_REASON)
            record_lost(self.outbox_dir, requeued, LOST_REASON)
