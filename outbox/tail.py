"""The kept tail: applied records kept a while, for applying again if the place they were
applied to loses them (a database restored from a backup, or failed over to a replica that
lagged).

A segment whose records are all flushed is *kept* rather than deleted for ``Keep.seconds``
after its records were applied (when this reader first found it finished, or its last write,
the seal, if later: a backlog applied long after it was written is kept its whole window), while
the kept segments hold no more than ``Keep.max_bytes`` in all and the disk keeps twice
``Keep.min_free_bytes`` free (the kept tail gives way before the disk reaches the watermark
where the worker stops claiming); beyond any of those the oldest go first. ``Keep()`` keeps
nothing: a flushed segment goes at once.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from outbox import fsutil
from outbox.segment import segment_name


@dataclass(frozen=True)
class Keep:
    """How much of the applied tail to keep: the newest ``seconds`` of it, no more than
    ``max_bytes``, and none of it once the disk has less than ``min_free_bytes`` free."""

    seconds: float = 0.0
    max_bytes: int = 0
    min_free_bytes: int = 0

    @property
    def keeps(self) -> bool:
        return self.seconds > 0 and self.max_bytes > 0


@dataclass(frozen=True)
class Finished:
    """A sealed segment whose records are all flushed: deleted, or kept."""

    shard: int
    segno: int
    size: int
    mtime: float  # when it was applied: first found finished, or last written (sealed) if later; Unix seconds


class Tail:
    """The finished segments of one directory, and which of them to delete now. Sizes and
    times are read once per segment (a finished segment is never written again)."""

    def __init__(self, directory: str, keep: Keep) -> None:
        self.directory, self.keep = directory, keep
        self._seen: dict[tuple[int, int], Finished] = {}

    def finished(self, shard: int, segno: int) -> Finished | None:
        """What the finished segment is (None once it is gone)."""
        key = (shard, segno)
        found = self._seen.get(key)
        if found is None:
            try:
                st = os.lstat(os.path.join(self.directory, segment_name(shard, segno)))
            except FileNotFoundError:
                return None
            found = self._seen[key] = Finished(shard, segno, st.st_size, max(st.st_mtime, time.time()))
        return found

    def to_delete(self, finished: list[Finished], now: float) -> list[Finished]:
        """Of ``finished`` (every finished segment there is), those to delete now: all of them
        when nothing is kept, else the oldest beyond the window, the byte cap or the disk's room."""
        if not self.keep.keeps:
            return finished
        by_age = sorted(finished, key=lambda f: (f.mtime, f.shard, f.segno))
        kept_bytes = sum(f.size for f in by_age)
        short = max(0, 2 * self.keep.min_free_bytes - fsutil.free_bytes(self.directory)) if self.keep.min_free_bytes else 0
        doomed: list[Finished] = []
        for f in by_age:
            if now - f.mtime <= self.keep.seconds and kept_bytes <= self.keep.max_bytes and short <= 0:
                break
            doomed.append(f)
            kept_bytes -= f.size
            short -= f.size
        return doomed

    def forget(self, gone: list[Finished]) -> None:
        for f in gone:
            self._seen.pop((f.shard, f.segno), None)
