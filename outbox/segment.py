"""Segment files: names, and a full scan that classifies a segment's state.

``scan`` reads a whole segment and tells exactly one of: clean (ends at a frame
boundary), torn tail (invalid bytes after the last valid frame, nothing valid after
them), or corrupt (damage followed by valid frames, a sequence gap, or damage in a
sealed segment).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from enum import Enum

from outbox.frame import Frame, Kind, decode_at, find_valid_after

_NAME = re.compile(r"^shard-(\d{4})-(\d{10})\.seg$")


def segment_name(shard: int, segno: int) -> str:
    return f"shard-{shard:04d}-{segno:010d}.seg"


def lock_name(shard: int) -> str:
    return f"shard-{shard:04d}.lock"


def parse_segment_name(name: str) -> tuple[int, int] | None:
    """(shard, segno) for a segment file name, else None."""
    m = _NAME.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def list_segments(directory: str) -> dict[int, list[int]]:
    """Segment numbers per shard, ascending."""
    out: dict[int, list[int]] = {}
    for name in os.listdir(directory):
        parsed = parse_segment_name(name)
        if parsed:
            out.setdefault(parsed[0], []).append(parsed[1])
    for segs in out.values():
        segs.sort()
    return out


class State(Enum):
    CLEAN = "clean"
    TORN = "torn"
    CORRUPT = "corrupt"


@dataclass
class Scan:
    """What a full read of one segment found."""

    shard: int
    segno: int
    size: int
    frames: list[Frame] = field(default_factory=list)
    sealed: bool = False
    state: State = State.CLEAN
    bad_offset: int | None = None  # first invalid byte, for TORN and CORRUPT
    reason: str = ""

    @property
    def valid_end(self) -> int:
        return self.frames[-1].end if self.frames else 0

    @property
    def data(self) -> list[Frame]:
        return [f for f in self.frames if f.kind is Kind.DATA]


def parse(buf: bytes, shard: int, segno: int, start: int = 0, next_seq: int = 0) -> Scan:
    """Classify ``buf`` (a segment's bytes) from ``start``, expecting ``next_seq`` first."""
    scan = Scan(shard, segno, len(buf))
    pos, expect = start, next_seq
    while pos < len(buf):
        frame = decode_at(buf, pos, shard, segno)
        if frame is None:
            return _classify_damage(scan, buf, pos)
        if frame.seq != expect:
            return _mark(scan, State.CORRUPT, pos, f"sequence {frame.seq} where {expect} expected")
        if (frame.kind is Kind.HEADER) != (expect == 0):
            return _mark(scan, State.CORRUPT, pos, f"{frame.kind.name} frame at sequence {expect}")
        scan.frames.append(frame)
        pos, expect = frame.end, expect + 1
        if frame.kind is Kind.SEAL:
            scan.sealed = True
            if pos != len(buf):
                return _mark(scan, State.CORRUPT, pos, "bytes after the seal")
    return scan


def _classify_damage(scan: Scan, buf: bytes, pos: int) -> Scan:
    if find_valid_after(buf, pos + 1, scan.shard, scan.segno) is not None:
        return _mark(scan, State.CORRUPT, pos, "invalid frame followed by valid frames")
    return _mark(scan, State.TORN, pos, "invalid bytes after the last valid frame")


def _mark(scan: Scan, state: State, pos: int, reason: str) -> Scan:
    scan.state, scan.bad_offset, scan.reason = state, pos, reason
    return scan


def read_file(path: str) -> bytes:
    """A segment's bytes, never through a symlink (ELOOP instead)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def scan_file(directory: str, shard: int, segno: int) -> Scan:
    """Read and classify one segment file."""
    return parse(read_file(os.path.join(directory, segment_name(shard, segno))), shard, segno)
