"""Where a worker's next claim starts looking: the claim floor.

A claim walks the claim index (queued jobs by priority, run_at, id) from the queue's head.
Claiming a job leaves its queued version's index entry behind; vacuum removes it, and a
later scan marks it dead and skips it cheaply, but only once no snapshot can still see the
job queued. While a long transaction elsewhere holds the xmin horizon, every entry claimed
since it began stays live to the walk, and each costs a heap visit: claims get slower the
longer the horizon is held (bench/horizon.py: a scan of the head touched ~10 pages, and
27,000 after a minute at 800 jobs/s).

So a worker starts each claim at the smallest key (priority, run_at, id) its previous claim
took: everything before it was claimed, or locked by another claimer, when that claim ran.
A job can still appear before the floor (enqueued with an earlier run_at or a smaller
priority, given back, retried at a smaller priority), so at least every ``FULL_SCAN_S`` a
claim starts from the head again, as does any claim after the floor found nothing: such a
job waits at most that much longer than it would have.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

FULL_SCAN_S = 0.25

Key = tuple[int, datetime, int]  # (priority, run_at, id)


class ClaimFloor:
    """One worker's floor: ``params()`` for the next claim, ``claimed()`` after it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.key: Key | None = None
        self.full_scan_at = float("-inf")

    def params(self) -> dict[str, Any]:
        """The claim's floor parameters: none (from the head) when the last full scan is old."""
        key = self.key if self.clock() - self.full_scan_at < FULL_SCAN_S else None
        if key is None:
            self.full_scan_at = self.clock()
        return {"floor_priority": key[0] if key else None, "floor_run_at": key[1] if key else None,
                "floor_id": key[2] if key else None}

    def claimed(self, keys: Sequence[Key], floored: bool) -> bool:
        """Record what a claim took; whether to claim again from the head at once (a claim
        from the floor found nothing: a job may wait before it)."""
        if keys:
            self.key = min(keys)
            return False
        self.key = None
        return floored
