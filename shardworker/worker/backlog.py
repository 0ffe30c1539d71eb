"""How far the flusher is behind: records this worker made durable and not yet applied.

The count is the parent's estimate, kept without reading the outbox: records the children
(and the parent, for a dead child's jobs) acknowledged, less those the flusher reports
flushed. It gates claims (``max_backlog``) and tells an idle worker when it may exit.

It runs behind for a moment when the flusher applies a record before the parent has read
the child's report of it (the count is then 0, not negative). It can drift high: after a
quarantine it is recounted from the outbox's files while the flusher goes on applying, and
a record applied in between counts as still to come. A count that only ever ran high would
pause claims and keep ``--exit-when-idle`` waiting for good, so when nothing is in flight
and the flusher is idle, the outbox itself is asked (at most once per ``RECOUNT_EVERY_S``):
empty on disk means nothing is behind.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import outbox

RECOUNT_EVERY_S = 1.0

log = logging.getLogger(__name__)


class Backlog:
    """Records acknowledged as durable and not yet flushed (call it for the number)."""

    def __init__(self, outbox_dir: str, flushed: Callable[[], int], clock: Callable[[], float]) -> None:
        self.outbox_dir, self._flushed, self.clock = outbox_dir, flushed, clock
        self._base = flushed()  # what earlier dispatchers' flushers applied: not ours to count
        self.acked = 0  # records (outcomes, steps) made durable since this dispatcher started
        self._steps_seen = 0  # of them, the steps children reported so far (a running total)
        self._recount_at = 0.0

    def __call__(self) -> int:
        # A child commits, then reports: the flusher may apply a record before its report is
        # read. Ahead of the reports, nothing is behind (0, not a negative count).
        return max(0, self.acked - (self._flushed() - self._base))

    def add(self, records: int) -> None:
        self.acked += records

    def steps_reported(self, total: int) -> None:
        """The children's running total of step records: count what is new in it."""
        self.acked, self._steps_seen = self.acked + total - self._steps_seen, total

    def reset(self, pending: int) -> None:
        """Start again from ``pending`` records known to be in the outbox (after a quarantine)."""
        self.acked = self._flushed() - self._base + pending

    def recount_if_drained(self, quiet: bool) -> None:
        """With ``quiet`` (nothing in flight, the flusher idle) and a count above 0, read the
        outbox: when it holds nothing, the count is 0."""
        if not quiet or self() <= 0:
            return
        now = self.clock()
        if now < self._recount_at:
            return
        self._recount_at = now + RECOUNT_EVERY_S
        try:
            pending = outbox.status(self.outbox_dir).pending
        except OSError as exc:
            log.debug("outbox not read for the backlog (%s)", exc)
            return
        if pending == 0:
            log.debug("backlog recounted: %d counted, the outbox holds none", self())
            self.acked = self._flushed() - self._base
