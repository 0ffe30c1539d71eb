"""The reader's view of one shard: ``Record`` (one record read), ``Budget`` (what one
``poll`` may still take), ``ShardState`` (the read cursor, the flushed position and the
records in flight) and ``read_frames``, which reads frames at the cursor of one segment.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field

import orjson

from outbox.checkpoint import Position
from outbox.frame import HEADER, HEADER_SIZE, MAX_PAYLOAD_BYTES, Kind, decode_at

_READ_CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Record:
    """One outcome read from the outbox."""

    shard: int
    segno: int
    seq: int
    ts_ms: int
    payload: bytes
    end: int

    def value(self) -> object:
        return orjson.loads(self.payload)


@dataclass
class Budget:
    """What one ``poll`` may still return: records and payload bytes (the first record
    is always taken)."""

    records_left: int
    bytes_left: int
    taken: int = 0

    @classmethod
    def of(cls, max_records: int, max_bytes: int | None) -> Budget:
        return cls(max_records, (1 << 62) if max_bytes is None else max_bytes)

    @property
    def spent(self) -> bool:
        return self.records_left <= 0 or (self.bytes_left <= 0 and self.taken > 0)

    def fits(self, size: int) -> bool:
        """Whether a record of ``size`` bytes goes in this poll; one that does not ends it."""
        if self.taken and size > self.bytes_left:
            self.records_left = 0
            return False
        return True

    def take(self, size: int) -> None:
        self.records_left -= 1
        self.bytes_left -= size
        self.taken += 1


@dataclass
class ShardState:
    cursor: Position  # next byte to read
    flushed: Position  # first record not yet flushed
    fd: int | None = None
    fd_segno: int = -1
    # Yielded but unflushed records, and segment boundaries crossed after them.
    inflight: deque[Position] = field(default_factory=deque)


def read_frames(fd: int, shard: int, state: ShardState, budget: Budget) -> tuple[list[Record], str]:
    """Read frames at the cursor from ``fd``, the cursor's segment; stop reason: more,
    sealed, end, damage or budget."""
    base = state.cursor.offset
    buf = os.pread(fd, _READ_CHUNK, base)
    full = len(buf) == _READ_CHUNK
    if full:
        buf = _extend_for_first_frame(fd, buf, base)
    pos, out = 0, list[Record]()
    while pos < len(buf) and not budget.spent:
        frame = decode_at(buf, pos, shard, state.cursor.segno)
        if frame is None and full and pos > 0:
            return out, "more"  # a frame straddles the chunk boundary: read again from it
        if frame is None or frame.seq != state.cursor.seq:
            return out, "damage"  # torn, in progress, corrupt or a gap: the caller decides
        if frame.kind is Kind.DATA and not budget.fits(len(frame.payload)):
            return out, "budget"  # left for the next poll, where it comes first
        pos = frame.end
        state.cursor = Position(state.cursor.segno, base + pos, frame.seq + 1)
        if frame.kind is Kind.SEAL:
            return out, "sealed"
        if frame.kind is Kind.DATA:
            segno = state.cursor.segno
            out.append(Record(shard, segno, frame.seq, frame.ts_ms, frame.payload, base + pos))
            state.inflight.append(state.cursor)
            budget.take(len(frame.payload))
    return out, "more" if pos < len(buf) or full else "end"


def _extend_for_first_frame(fd: int, buf: bytes, base: int) -> bytes:
    """Re-read when the first frame alone is bigger than one chunk."""
    length = HEADER.unpack_from(buf, 0)[0]
    if HEADER_SIZE + length > len(buf) and length <= MAX_PAYLOAD_BYTES:
        return os.pread(fd, HEADER_SIZE + length, base)
    return buf
