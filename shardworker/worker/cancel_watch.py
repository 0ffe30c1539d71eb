"""Running jobs an operator cancelled, found for the pool to stop (``shardworker jobs cancel``).

``job_cancel`` notifies ``shardworker_cancel`` with the running jobs it cancelled, each with
its attempt; the claim connection LISTENs and keeps them for ``take_cancelled``, so a cancel
reaches the handler within a pass. Only that attempt is stopped: a retry this worker claimed
before it heard the cancel runs on. A notification can be missed (the connection was away,
or a transaction pooler sits in between), so every ``POLL_S`` the worker also asks which of
the attempts it holds are cancelled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from shardworker.core.records import CancelKey
from shardworker.errors import StoreError

POLL_S = 2.0

log = logging.getLogger(__name__)


class CancelStore(Protocol):
    def take_cancelled(self) -> set[CancelKey]: ...
    def cancelled_among(self, keys: Sequence[tuple[int, int]]) -> set[tuple[int, int]]: ...


class CancelPool(Protocol):
    @property
    def in_flight(self) -> int: ...
    def job_keys(self) -> list[tuple[int, int]]: ...
    def cancel(self, keys: set[CancelKey]) -> int: ...


def matching(held: Iterable[tuple[int, int]], keys: set[CancelKey]) -> list[tuple[int, int]]:
    """The held (job id, attempt) pairs that ``keys`` cancel."""
    return [(i, a) for i, a in held if (i, a) in keys or (i, None) in keys]


class CancelWatch:
    """Hands the pool the ids of the jobs it holds that an operator cancelled."""

    def __init__(self, store: CancelStore, pool: CancelPool, clock: Callable[[], float] = time.monotonic,
                 poll_s: float = POLL_S) -> None:
        self.store, self.pool, self.clock, self.poll_s = store, pool, clock, poll_s
        self._poll_at = clock() + poll_s

    def run_once(self, db_ok: bool) -> None:
        keys = self.store.take_cancelled()
        now = self.clock()
        if db_ok and now >= self._poll_at and self.pool.in_flight:
            self._poll_at = now + self.poll_s
            try:
                keys |= self.store.cancelled_among(self.pool.job_keys())
            except StoreError as exc:  # the claims tell of the database; try at the next poll
                log.debug("cancelled jobs not polled: %s", exc)
        if keys:
            held = self.pool.cancel(keys)
            if held:
                log.info("%d %s held here cancelled by an operator; stopping %s", held,
                         "job" if held == 1 else "jobs", "it" if held == 1 else "them")
