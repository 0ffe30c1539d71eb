"""The worker's watch for queued kinds that no live worker serves.

A job whose kind no worker has a handler for (a typo, a worker not deployed yet or gone, a
queue nobody claims from) waits unseen. Every ``interval_s`` (on the housekeeping thread) the
watch asks which queued (queue, kind) pairs no live worker serves, this one's own kinds
counted as served (``shardworker.store.serving``), and says each pair once when it appears:
not again every check while it stays, and again if it goes away and comes back. Each check
opens a short-lived connection of its own (``connect``) with a short statement timeout: on
millions of queued rows it is worth skipping, never waiting for, and it may run from any
thread; a failed check is skipped (an outage is told by the loops that depend on the database).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from shardworker.core.counts import unserved_text
from shardworker.core.views import UnservedKind
from shardworker.errors import StoreError

log = logging.getLogger(__name__)

UNSERVED_INTERVAL_S = 30.0


class UnservedStore(Protocol):
    def unserved_kinds(self, also_kinds: Sequence[str] = (), also_queues: Sequence[str] | None = None,
                       limit: int = ...) -> list[UnservedKind]: ...
    def close(self) -> None: ...


class UnservedWatch:
    """``run_once()`` checks when ``interval_s`` has passed since the last check; ``tell_all()``
    says every pair now unserved (a worker exiting idle leaves them behind)."""

    def __init__(self, connect: Callable[[], UnservedStore], kinds: Sequence[str], queues: Sequence[str] | None, *,
                 interval_s: float = UNSERVED_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.connect, self.kinds, self.queues = connect, list(kinds), list(queues) if queues else None
        self.interval_s, self.clock = interval_s, clock
        self._next = 0.0
        self._told: set[tuple[str, str]] = set()

    def run_once(self) -> None:
        now = self.clock()
        if now < self._next:
            return
        self._next = now + self.interval_s
        rows = self._read()
        if rows is None:
            return
        fresh = [row for row in rows if (row.queue, row.kind) not in self._told]
        self._told = {(row.queue, row.kind) for row in rows}
        if fresh:
            self._say(fresh)

    def tell_all(self) -> None:
        rows = self._read()
        if rows:
            self._say(rows)

    def _read(self) -> list[UnservedKind] | None:
        store = self.connect()
        try:
            return store.unserved_kinds(self.kinds, self.queues)
        except StoreError as exc:
            log.debug("could not look for queued kinds no live worker serves: %s", exc)
            return None
        finally:
            store.close()

    @staticmethod
    def _say(rows: list[UnservedKind]) -> None:
        log.warning("queued jobs that no live worker handles wait unseen (a typo in a kind, or its worker "
                    "not running?): %s", "; ".join(unserved_text(row) for row in rows))
