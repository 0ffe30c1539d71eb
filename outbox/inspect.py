"""Read-only inspection of an outbox directory: ``status``, ``verify`` and ``tail_records``.

Both work without any lock and without a database, so an operator can run them while a
worker is up, or on a directory copied from a dead host. Both refuse (``OutboxUntrusted``) a
directory that is a symlink or another user's (``fsutil.check_dir``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from outbox import checkpoint, fsutil
from outbox.checkpoint import Position
from outbox.frame import HEADER_SIZE, Kind, decode_at
from outbox.reader import FLUSHER_LOCK
from outbox.recovery import QUARANTINE_DIR, TORN_DIR
from outbox.segment import State, list_segments, lock_name, parse, parse_segment_name, read_file, segment_name


@dataclass(frozen=True)
class ShardStatus:
    """Pending (unflushed) records of one shard."""

    shard: int
    pending: int
    pending_bytes: int
    oldest_age_s: float | None
    segments: int
    writer_alive: bool
    sealed_segments: int = 0
    # The kept tail (``outbox.tail``): finished segments before the checkpoint, applied and
    # kept for applying again; their bytes, and how long ago the oldest was sealed.
    kept_segments: int = 0
    kept_bytes: int = 0
    kept_oldest_age_s: float | None = None


@dataclass(frozen=True)
class OutboxStatus:
    """The whole directory at a glance."""

    directory: str
    shards: list[ShardStatus]
    quarantined: list[str]
    torn_tails: list[str]
    flusher_alive: bool

    @property
    def pending(self) -> int:
        return sum(s.pending for s in self.shards)

    @property
    def kept_bytes(self) -> int:
        return sum(s.kept_bytes for s in self.shards)

    @property
    def kept_segments(self) -> int:
        return sum(s.kept_segments for s in self.shards)

    @property
    def kept_oldest_age_s(self) -> float | None:
        ages = [s.kept_oldest_age_s for s in self.shards if s.kept_oldest_age_s is not None]
        return max(ages) if ages else None


def status(directory: str, *, now: float | None = None) -> OutboxStatus:
    """Count records after the checkpoint, per shard (the checkpoint may lag a live flusher)."""
    now = time.time() if now is None else now
    fsutil.check_dir(directory)
    saved = checkpoint.load(directory)
    shards = [_shard_status(directory, shard, segs, saved.get(shard, Position(0, 0, 0)), now)
              for shard, segs in sorted(list_segments(directory).items())]
    return OutboxStatus(directory, shards, _listing(directory, QUARANTINE_DIR), _listing(directory, TORN_DIR),
                        fsutil.is_locked(os.path.join(directory, FLUSHER_LOCK)))


def _shard_status(directory: str, shard: int, segs: list[int], pos: Position, now: float) -> ShardStatus:
    pending = nbytes = 0
    oldest: int | None = None
    for segno in segs:
        if segno < pos.segno:
            continue
        try:
            buf = read_file(os.path.join(directory, segment_name(shard, segno)))
        except FileNotFoundError:
            continue  # deleted by a live flusher meanwhile
        start, seq = (pos.offset, pos.seq) if segno == pos.segno else (0, 0)
        for frame in parse(buf, shard, segno, start, seq).frames:
            if frame.kind is Kind.DATA:
                pending += 1
                nbytes += frame.end - frame.offset
                oldest = frame.ts_ms if oldest is None else min(oldest, frame.ts_ms)
    age = None if oldest is None else max(0.0, now - oldest / 1000)
    alive = fsutil.is_locked(os.path.join(directory, lock_name(shard)))
    sealed = sum(1 for segno in segs if _is_sealed(directory, shard, segno))
    kept = [st for segno in segs[:-1] if segno < pos.segno and (st := _lstat(directory, shard, segno)) is not None]
    kept_age = max(0.0, now - min(st.st_mtime for st in kept)) if kept else None
    return ShardStatus(shard, pending, nbytes, age, len(segs), alive, sealed, len(kept),
                       sum(st.st_size for st in kept), kept_age)


def _lstat(directory: str, shard: int, segno: int) -> os.stat_result | None:
    try:
        return os.lstat(os.path.join(directory, segment_name(shard, segno)))
    except FileNotFoundError:
        return None  # deleted by a live flusher meanwhile


def _is_sealed(directory: str, shard: int, segno: int) -> bool:
    """Whether the segment ends with a valid SEAL frame (reads only its last frame)."""
    try:
        fd = os.open(os.path.join(directory, segment_name(shard, segno)), os.O_RDONLY | fsutil.NOFOLLOW)
    except FileNotFoundError:
        return False
    try:
        size = os.fstat(fd).st_size
        if size < HEADER_SIZE:
            return False
        tail = os.pread(fd, HEADER_SIZE, size - HEADER_SIZE)
    finally:
        os.close(fd)
    frame = decode_at(tail, 0, shard, segno)
    return frame is not None and frame.kind is Kind.SEAL


def pending_records(directory: str) -> list[bytes]:
    """Payloads of every record after the checkpoint, all shards (the checkpoint may lag a live
    flusher, so some may be applied already); for telling which outcomes are still coming."""
    saved = checkpoint.load(directory)
    found: list[bytes] = []
    for shard, segs in list_segments(directory).items():
        pos = saved.get(shard, Position(0, 0, 0))
        for segno in segs:
            if segno < pos.segno:
                continue
            try:
                buf = read_file(os.path.join(directory, segment_name(shard, segno)))
            except FileNotFoundError:
                continue  # applied and deleted by the flusher meanwhile
            start, seq = (pos.offset, pos.seq) if segno == pos.segno else (0, 0)
            found.extend(f.payload for f in parse(buf, shard, segno, start, seq).data)
    return found


def kept_records(directory: str) -> int:
    """How many records the kept tail holds (records before the checkpoint, applied)."""
    saved = checkpoint.load(directory)
    count = 0
    for shard, segs in list_segments(directory).items():
        pos = saved.get(shard, Position(0, 0, 0))
        for segno in segs:
            if segno > pos.segno:
                break
            try:
                frames = parse(read_file(os.path.join(directory, segment_name(shard, segno))), shard, segno).frames
            except FileNotFoundError:
                continue
            count += sum(1 for f in frames if f.kind is Kind.DATA and (segno < pos.segno or f.end <= pos.offset))
    return count


def records_since(directory: str, shard: int, since: float) -> list[bytes]:
    """Payloads of the durable records of ``shard`` in the segments modified at or after
    ``since`` (a ``time.time()``), oldest first: every record written since then, and some
    before. A torn tail is not durable and is left out.

    For a dead writer's records since a moment: those are all it could have acknowledged
    since then, and segments older than that moment need not be read.
    """
    found: list[list[bytes]] = []
    for segno in reversed(list_segments(directory).get(shard, [])):
        path = os.path.join(directory, segment_name(shard, segno))
        try:
            if os.stat(path).st_mtime < since:
                break
            buf = read_file(path)
        except FileNotFoundError:
            continue  # applied and deleted by the flusher meanwhile
        found.append([f.payload for f in parse(buf, shard, segno).data])
    return [payload for segment in reversed(found) for payload in segment]


def _listing(directory: str, sub: str) -> list[str]:
    path = os.path.join(directory, sub)
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


@dataclass(frozen=True)
class SegmentReport:
    """What ``verify`` found in one segment file."""

    path: str  # relative to the outbox directory
    state: str  # clean, torn, corrupt
    sealed: bool
    records: int
    bad_offset: int | None
    reason: str


@dataclass
class VerifyReport:
    segments: list[SegmentReport] = field(default_factory=list)

    @property
    def corrupt(self) -> list[SegmentReport]:
        bad = State.CORRUPT.value
        return [s for s in self.segments if s.state == bad or s.path.startswith(QUARANTINE_DIR)]

    @property
    def torn(self) -> list[SegmentReport]:
        return [s for s in self.segments if s.state == State.TORN.value]


def verify(directory: str) -> VerifyReport:
    """Checksum every frame of every segment, quarantined ones included."""
    report = VerifyReport()
    fsutil.check_dir(directory)
    for sub in ("", QUARANTINE_DIR):
        folder = os.path.join(directory, sub)
        if not os.path.lexists(folder):
            continue
        fsutil.check_dir(folder)
        for name in sorted(os.listdir(folder)):
            parsed = parse_segment_name(name)
            if parsed is None:
                continue
            try:
                scan = parse(read_file(os.path.join(folder, name)), *parsed)
            except FileNotFoundError:
                continue  # deleted by a live flusher meanwhile (a quarantined one is listed later)
            report.segments.append(SegmentReport(os.path.join(sub, name) if sub else name, scan.state.value,
                                                 scan.sealed, len(scan.data), scan.bad_offset, scan.reason))
    return report
