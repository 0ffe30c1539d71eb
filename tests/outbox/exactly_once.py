"""What the outbox fault tests share: reading every record back, a producer of numbered
records, and the exactly-once check.

Every fault test counts three sets of record ids: *attempted* (appended), *acknowledged*
(commit returned) and *read* (yielded by a reader). It holds when every acknowledged id
is read exactly once and nothing read was never attempted.
"""

from __future__ import annotations

import os

import outbox
from outbox import OutboxError, OutboxFull, OutboxReader, OutboxSyncError, ShardWriter, WriterConfig

SMALL = WriterConfig(segment_bytes=4096, reserve_bytes=0)
PYTHONPATH = os.path.dirname(os.path.dirname(outbox.__file__))


def drain(reader: OutboxReader) -> list[outbox.Record]:
    out: list[outbox.Record] = []
    while chunk := reader.poll(50):
        out.extend(chunk)
    return out


def read_ids(directory: str) -> list[int]:
    """Ids of every record a fresh reader yields (nothing marked flushed)."""
    with OutboxReader.open(directory) as reader:
        return [r.value()["id"] for r in drain(reader)]  # type: ignore[index]


def assert_exactly_once(read: list[int], acked: set[int], attempted: set[int]) -> None:
    assert len(read) == len(set(read)), "a record was read twice"
    assert acked <= set(read), f"acknowledged but lost: {sorted(acked - set(read))[:10]}"
    assert set(read) <= attempted, f"read but never attempted: {sorted(set(read) - attempted)[:10]}"


class Producer:
    """Commits batches of ids to one writer and keeps the three sets."""

    def __init__(self, writer: ShardWriter) -> None:
        self.writer = writer
        self.attempted: set[int] = set()
        self.acked: set[int] = set()
        self.failures: list[type[OutboxError]] = []
        self._next = 0

    @property
    def fulls(self) -> int:
        return self.failures.count(OutboxFull)

    def batch(self, n: int, pad: int = 200) -> bool:
        """Append and commit ``n`` records; False if the commit raised OutboxFull or OutboxSyncError."""
        ids = range(self._next, self._next + n)
        self._next += n
        self.attempted.update(ids)
        for i in ids:
            self.writer.append({"id": i, "pad": "f" * pad})
        try:
            self.writer.commit()
        except (OutboxFull, OutboxSyncError) as exc:
            self.failures.append(type(exc))
            return False
        self.acked.update(ids)
        return True
