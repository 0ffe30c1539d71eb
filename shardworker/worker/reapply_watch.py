"""The parent's side of a database that comes back older (the flusher's is
``shardworker.flusher.marks``): claim nothing on a database that may have gone back in time
until what this worker applied is there, or landing again.

* Whenever the dispatcher's connection is new (a reconnect after an outage, a failover), it
  asks the flusher to check the outbox's mark (``FlusherHandle.check_mark``) and claims
  nothing until that check is done and nothing is being re-applied. A claim on a connection
  made since the last look is refused (``claim_within(generation=...)``), so none slips in.
* When the server is another than before (its start time or the database's oid changed: a
  failover, a restore, a restart; the dispatcher's reconnect or a heartbeat sees it), it also
  holds every worker's claims for ``settle_s`` (``claim_holds``): long enough for each of them
  to reconnect and check its own mark, a peer whose mark is behind holding them on until it
  has re-applied. Then it claims again the jobs its children hold whose claims the database
  lost (``job_reclaim``), so no other worker claims them meanwhile.
* Once a re-apply is over and the flusher idle, the jobs still running for this worker that it
  does not hold and whose outcomes are nowhere in the outbox went back with the database past
  the kept tail: they are requeued, charged an attempt (``lost.jsonl`` names them), instead of
  staying ``running`` until this worker stops.

Every call may raise ``StoreError``: the dispatcher retries it as it retries a claim.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from shardworker.flusher.process import FlusherHandle
from shardworker.model import ClaimedJob
from shardworker.worker.quarantine_watch import pending_job_ids, record_lost

log = logging.getLogger(__name__)

LOST_REASON = ("outcome lost: the database went back in time further than the outbox keeps "
               "(--reapply-window), to before this attempt's outcome landed")


class WatchStore(Protocol):
    generation: int

    def connection(self) -> object: ...
    def server_identity(self) -> str: ...
    def hold_claims(self, holder: str, reason: str, seconds: float) -> None: ...
    def reclaim(self, worker_id: str, jobs: Sequence[ClaimedJob]) -> list[int]: ...
    def requeue_lost(self, worker_id: str, error: str, keep_ids: Sequence[int]) -> list[int]: ...


class ReapplyWatch:
    """Call ``run_once()`` before each claim, then claim only when ``blocker()`` is ""."""

    def __init__(self, store: WatchStore, flusher: FlusherHandle, worker_id: str, outbox_dir: str, *,
                 held: Callable[[], list[ClaimedJob]], still_coming: Callable[[], Iterable[int]],
                 heard: Callable[[], str], settle_s: float) -> None:
        self.store, self.flusher, self.worker_id, self.outbox_dir = store, flusher, worker_id, outbox_dir
        self.held, self.still_coming, self.heard, self.settle_s = held, still_coming, heard, settle_s
        self.generation = -1  # the dispatcher's connection last looked at: claims go on that one only
        self.server = ""  # the server last seen (server_identity)
        self._heard = ""  # the server the heartbeat said last
        self._asked: int | None = None  # the flusher's check awaited
        self._reclaim = False  # a new server: claim again what the children hold, once checked
        self._regressions = 0  # re-applies seen so far
        self._settle_lost = False  # one ended: requeue what went back past the kept tail, once idle

    def blocker(self) -> str:
        if self._asked is not None:
            return "checking that the database still holds what this worker applied"
        if self.flusher.reapplying:
            return "re-applying what the database lost when it went back in time"
        return ""

    def run_once(self) -> None:
        self.store.connection()  # opened now if it was lost: a new one is looked at before any claim
        if self.store.generation != self.generation:
            identity = self.store.server_identity()
            self.generation = self.store.generation
            self._seen(identity)
            self._asked = self.flusher.check_mark()
        heard = self.heard()
        if heard and heard != self._heard:  # the heartbeat's own news only: it may lag the dispatcher's look
            self._heard = heard
            self._seen(heard)
        if self._asked is not None and self.flusher.mark_checked(self._asked):
            self._asked = None
            if self._reclaim:
                self._reclaim_held()
        regressions = self.flusher.counters()["regressions"]
        if regressions > self._regressions:
            self._regressions, self._settle_lost = regressions, True
        if self._settle_lost and self._asked is None and not self.flusher.reapplying and self.flusher.idle:
            self._requeue_lost()

    def _seen(self, identity: str) -> None:
        """The server a connection or a beat reached: a new one after a known one may hold an
        older database. Hold every worker's claims a while, check, and claim again what we hold."""
        if not identity or identity == self.server:
            return
        known, self.server = self.server, identity
        if not known:
            return  # the first look of this run: the flusher checks at its start anyway
        self.store.hold_claims(f"settle:{self.worker_id}", f"worker {self.worker_id} reached a new server",
                               self.settle_s)
        log.info("reached a new database server (a restart, a failover or a restore): every worker's claims are "
                 "held %.0fs while each checks that the database still holds what it applied", self.settle_s)
        self._reclaim = True
        if self._asked is None:
            self._asked = self.flusher.check_mark()

    def _reclaim_held(self) -> None:
        self._reclaim = False
        held = self.held()
        again = self.store.reclaim(self.worker_id, held)
        if again:
            log.warning("claimed again %d jobs this worker's children hold, whose claims the database lost when it "
                        "went back in time", len(again))

    def _requeue_lost(self) -> None:
        keep = {j.id for j in self.held()} | set(self.still_coming()) | set(pending_job_ids(self.outbox_dir))
        requeued = self.store.requeue_lost(self.worker_id, LOST_REASON, sorted(keep))
        self._settle_lost = False
        if requeued:
            log.error("%d running jobs requeued, charged an attempt: %s", len(requeued), LOST_REASON)
            record_lost(self.outbox_dir, requeued, LOST_REASON)
