"""Giving back claimed jobs no child started: at a stop, and at the next start what a stop
could not.

While the worker runs, ``GiveBack`` keeps the tokens of claims whose reply was lost (the
server may have committed them) and releases their jobs before the next claim. At a stop,
``GiveBack.at_stop`` releases uncharged the jobs no child started and those of lost
claims, retrying until the shutdown's deadline. A stop during an outage cannot release
them; it then keeps them in the outbox directory's ``giveback.json``
(``shardworker.core.layout``). The next start on that directory, and ``outbox drain``, release
them here (``release_saved``): after the flusher has applied every pending outcome and
before orphans are requeued (which would charge each an attempt), with the fenced
statements a stop uses (``job_release`` by id, attempt and worker; ``job_release_claim``
by token). A job rescued or changed meanwhile is simply not matched. Jobs whose handler
was running when the worker died are not here: unfinished work is at-least-once.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from shardworker.core import layout
from shardworker.core.retry import Backoff, retry_call
from shardworker.core.wire import JobKey
from shardworker.errors import StoreError

log = logging.getLogger(__name__)


class GiveBackStore(Protocol):
    def release(self, jobs: Sequence[tuple[int, int]], worker_id: str) -> int: ...
    def release_claim(self, claim_token: str, worker_id: str) -> int: ...


def release_saved(directory: str, store: GiveBackStore) -> int:
    """Release everything ``giveback.json`` holds, then remove it; returns how many jobs were
    released. A ``StoreError`` leaves the file whole: releasing again is harmless (fenced)."""
    held = layout.read_giveback(directory)
    if not held:
        return 0
    released = 0
    for worker_id, entry in held.items():
        released += store.release([(j, a) for j, a in entry["jobs"]], worker_id)
        for token in entry["claims"]:
            released += store.release_claim(token, worker_id)
    layout.remove_giveback(directory)
    jobs = sum(len(e["jobs"]) for e in held.values())
    claims = sum(len(e["claims"]) for e in held.values())
    log.info("gave back %d jobs left unstarted at the last stop, no attempt charged (%d jobs and %d lost claims "
             "were kept; a job rescued or changed since is left as it is)", released, jobs, claims)
    return released


class GiveBack:
    """One worker's lost claims, and its give-back at a stop."""

    def __init__(self, store: GiveBackStore, worker_id: str, outbox_dir: str, backoff: Callable[[], Backoff], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.worker_id, self.outbox_dir = store, worker_id, outbox_dir
        self.backoff, self.clock = backoff, clock
        self.lost_claims: list[str] = []  # tokens of claims whose reply was lost

    def settle_lost_claims(self) -> None:
        """Give back the jobs of claims whose replies were lost; raises ``StoreError`` (the
        tokens are kept) when the database fails meanwhile."""
        while self.lost_claims:
            released = self.store.release_claim(self.lost_claims[0], self.worker_id)
            if released:
                log.warning("gave back %d jobs of a claim whose reply was lost", released)
            self.lost_claims.pop(0)

    def at_stop(self, unstarted: list[JobKey], deadline: float) -> int:
        """Release jobs no child started and the jobs of lost claims, retrying until
        ``deadline``; returns how many were released."""
        released = [0]

        def attempt() -> None:
            if unstarted:
                released[0] += self.store.release(unstarted, self.worker_id)
                unstarted.clear()
            self.settle_lost_claims()

        try:
            retry_call(attempt, "giving back unstarted jobs", log=log, deadline=deadline, clock=self.clock,
                       backoff=self.backoff())
            return released[0]
        except StoreError as exc:
            self._keep_for_next_start(unstarted, exc)
            return released[0]

    def _keep_for_next_start(self, unstarted: list[JobKey], exc: StoreError) -> None:
        """Keep what could not be given back in ``giveback.json``: the next start (or
        ``outbox drain``) releases it uncharged (``release_saved``)."""
        try:
            layout.save_giveback(self.outbox_dir, self.worker_id, unstarted, self.lost_claims)
        except OSError as err:
            log.warning("could not give back %d unstarted jobs and %d claims whose replies were lost (%s), nor "
                        "keep them in the outbox (%s); they stay running under worker %s and its next start "
                        "charges each an attempt", len(unstarted), len(self.lost_claims), exc, err, self.worker_id)
            return
        log.warning("could not give back %d unstarted jobs and %d claims whose replies were lost (%s); kept in "
                    "%s: the next start or `shardworker outbox drain` gives them back, no attempt charged, if it "
                    "comes within --rescue-after (after that a peer's rescue requeues them, charged an attempt)",
                    len(unstarted), len(self.lost_claims), exc, layout.GIVEBACK_FILE)
