"""What the dashboard last read, so that a database outage greys the page instead of blanking it.

Each page's last successful read (the overview, and the most recent ``MAX_KEPT`` job pages)
is kept with the time it was read; while the database is away a page shows that, greyed,
with its time and one banner saying since when the database is away. Kept in the dashboard
process only: a dashboard started during an outage has nothing to show yet.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

MAX_KEPT = 200  # job pages remembered; the overview is one more


@dataclass(frozen=True)
class Shown:
    """What a page shows: ``value`` (None: nothing to show), read at ``read_at`` when it is
    the last data kept from before the database went away (None: read just now)."""

    value: Any
    read_at: datetime | None = None
    down_since: datetime | None = None


class Memory:
    """The last reads, by page key. The web app calls it on its event loop only."""

    def __init__(self) -> None:
        self._reads: OrderedDict[Hashable, tuple[Any, datetime]] = OrderedDict()
        self.down_since: datetime | None = None

    def shown(self, key: Hashable, value: Any, db_error: str | None) -> Shown:
        """What to show after a read of ``key`` that gave ``value`` or failed with ``db_error``."""
        if db_error is None:
            self.down_since = None
            if value is None:
                self._reads.pop(key, None)  # gone (a deleted job): nothing to keep
            else:
                self._reads[key] = (value, datetime.now(UTC))
                self._reads.move_to_end(key)
                while len(self._reads) > MAX_KEPT + 1:
                    self._reads.popitem(last=False)
            return Shown(value)
        if self.down_since is None:
            self.down_since = datetime.now(UTC)
        kept = self._reads.get(key)
        if kept is None:
            return Shown(None, down_since=self.down_since)
        return Shown(kept[0], kept[1], self.down_since)
