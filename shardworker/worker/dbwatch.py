"""The parent's one view of whether PostgreSQL answers, told in one line per change.

The dispatcher's claims and the flusher's batches both meet an outage, each retrying with
its own backoff; neither logs its retries. This watch hears from both and writes a line
when the database is lost (with why) and one when it is back (with how long it was away
and how many outcomes waited in the outbox meanwhile), and feeds the ``database up``
metric.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class DatabaseWatch:
    """``update`` it once a loop with what the dispatcher and the flusher last saw."""

    def __init__(self, backlog: Callable[[], int], clock: Callable[[], float] = time.monotonic) -> None:
        self.backlog, self.clock = backlog, clock
        self.up = True
        self.down_since = 0.0
        self.peak_backlog = 0  # the most outcomes waiting in the outbox during this outage
        self.outages = 0
        self.last_outage_s = 0.0

    def update(self, failure: str | None) -> None:
        """``failure``: why the database failed the last try (the dispatcher's or the
        flusher's), or None when both last succeeded."""
        if failure is not None:
            if self.up:
                self.up, self.down_since, self.peak_backlog = False, self.clock(), 0
                self.outages += 1
                log.warning("database unreachable (%s): claiming paused; children finish the jobs they hold, "
                            "and outcomes wait in the outbox", failure)
            self.peak_backlog = max(self.peak_backlog, self.backlog())
        elif not self.up:
            self.up = True
            self.last_outage_s = self.clock() - self.down_since
            waited = max(self.peak_backlog, self.backlog())
            log.info("database back after %.1fs: %d outcomes waited in the outbox; claiming resumed",
                     self.last_outage_s, waited, extra={"outage_s": round(self.last_outage_s, 3),
                                                        "outcomes_waited": waited})
