"""What the outbox fault tests share: reading every record back, and the exactly-once check.

Every fault test counts three sets of record ids: *attempted* (appended), *acknowledged*
(commit returned) and *read* (yielded by a reader). It holds when every acknowledged id
is read exactly once and nothing read was never attempted.
"""

from __future__ import annotations

import os

import outbox
from outbox import OutboxReader, WriterConfig

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
