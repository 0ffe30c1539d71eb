"""Crash recovery of a shard's unsealed segments, run while holding the shard's lock.

A writer that died leaves its last segment unsealed, possibly with a torn tail (bytes of
a frame that never finished). Recovery copies such a tail aside into ``torn/``, truncates
it, and seals the segment so readers know it is complete. A segment whose damage is
followed by valid frames is corrupt: it is moved into ``quarantine/`` and reported.

Recovery never frees a segment number: a segment left without even a header is sealed
empty, and ``highest_segno`` counts quarantined segments, so a shard's numbers only grow
and a reader's cursor never points past a segment written later.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from dataclasses import dataclass

from outbox import fsutil
from outbox.frame import Kind, encode
from outbox.segment import Scan, State, list_segments, lock_name, parse, read_file, segment_name

log = logging.getLogger(__name__)

TORN_DIR = "torn"
QUARANTINE_DIR = "quarantine"


@dataclass(frozen=True)
class RecoveryEvent:
    """One thing recovery did to a segment."""

    shard: int
    segno: int
    action: str  # "truncated", "quarantined", "sealed"
    offset: int
    detail: str


def recover_shard(directory: str, shard: int) -> list[RecoveryEvent]:
    """Seal every unsealed segment of ``shard``; the caller must hold the shard's lock."""
    events: list[RecoveryEvent] = []
    for segno in list_segments(directory).get(shard, []):
        path = os.path.join(directory, segment_name(shard, segno))
        try:
            scan = parse(read_file(path), shard, segno)
        except FileNotFoundError:
            continue  # the flusher deleted it meanwhile: it was sealed and fully flushed
        if scan.sealed and scan.state is State.CLEAN:
            continue
        events.extend(_recover_segment(directory, path, scan))
    for event in events:
        if event.action == "sealed":
            # Routine after any unclean stop: the segment a writer left open is closed where
            # its last whole record ends. Nothing acknowledged is lost.
            log.info("outbox shard %s segment %s closed at offset %s after an unclean stop (its records are kept)",
                     event.shard, event.segno, event.offset)
            continue
        level = logging.ERROR if event.action == "quarantined" else logging.WARNING
        log.log(level, "outbox shard %s segment %s %s at offset %s: %s",
                event.shard, event.segno, event.action, event.offset, event.detail)
    return events


def _recover_segment(directory: str, path: str, scan: Scan) -> list[RecoveryEvent]:
    if scan.state is State.CORRUPT:
        quarantine(directory, scan.shard, scan.segno)
        return [RecoveryEvent(scan.shard, scan.segno, "quarantined", scan.bad_offset or 0, scan.reason)]
    events = []
    if scan.state is State.TORN:
        _copy_tail_aside(directory, path, scan)
        events.append(RecoveryEvent(scan.shard, scan.segno, "truncated", scan.valid_end,
                                    f"{scan.size - scan.valid_end} torn bytes copied to {TORN_DIR}/"))
    _truncate_and_seal(path, scan)
    return [*events, RecoveryEvent(scan.shard, scan.segno, "sealed", scan.valid_end, "")]


def _copy_tail_aside(directory: str, path: str, scan: Scan) -> None:
    torn = os.path.join(directory, TORN_DIR)
    fsutil.ensure_dir(torn)
    tail = read_file(path)[scan.valid_end:]
    name = f"{os.path.basename(path)}.{scan.valid_end}.{time.time_ns()}.tail"
    fsutil.atomic_write(torn, name, tail)


def _truncate_and_seal(path: str, scan: Scan) -> None:
    """Cut ``path`` after its last valid frame and seal it, durably.

    A segment without even a header (its writer died while creating it) gets a header
    first: it stays as an empty sealed segment rather than freeing its number.
    """
    now_ms = time.time_ns() // 1_000_000
    if scan.frames:
        seal = encode(scan.shard, scan.segno, Kind.SEAL, scan.frames[-1].seq + 1, now_ms, b"")
    else:
        seal = (encode(scan.shard, scan.segno, Kind.HEADER, 0, now_ms, b"")
                + encode(scan.shard, scan.segno, Kind.SEAL, 1, now_ms, b""))
    fd = os.open(path, os.O_WRONLY | fsutil.NOFOLLOW)
    try:
        os.ftruncate(fd, scan.valid_end)
        os.lseek(fd, scan.valid_end, os.SEEK_SET)
        if os.write(fd, seal) != len(seal):
            os.ftruncate(fd, scan.valid_end)
            raise OSError("short write while sealing a recovered segment")
        os.fdatasync(fd)
    finally:
        os.close(fd)


def retire_shard(directory: str, shard: int, last: int, *, sealed: bool = False) -> bool:
    """If no writer holds ``shard`` and ``last`` is still its newest segment: seal ``last``
    and put an empty sealed segment after it, so a reader passes it and it can be deleted.
    False (nothing done) while a writer holds the shard: a live writer rotates by itself.
    ``sealed``: the caller read ``last`` to its seal (a writer closed it), so it is not read
    again here (at a worker's exit, reading every record of each shard once more)."""
    lock_fd = fsutil.try_lock(os.path.join(directory, lock_name(shard)))
    if lock_fd is None:
        return False
    try:
        if list_segments(directory).get(shard, [])[-1:] != [last]:
            return False  # a writer came and went meanwhile: its segment is newer
        if not sealed:
            recover_shard(directory, shard)
        write_empty_segment(directory, shard, highest_segno(directory, shard) + 1)
        return True
    finally:
        os.close(lock_fd)


def write_empty_segment(directory: str, shard: int, segno: int) -> None:
    """Create segment ``segno`` sealed and empty (a header and a seal), durably; the caller
    holds the shard's lock. It keeps the shard's highest number once the flusher deletes the
    applied segments before it, so numbers never go backwards."""
    now_ms = time.time_ns() // 1_000_000
    data = encode(shard, segno, Kind.HEADER, 0, now_ms, b"") + encode(shard, segno, Kind.SEAL, 1, now_ms, b"")
    path = os.path.join(directory, segment_name(shard, segno))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | fsutil.NOFOLLOW, fsutil.FILE_MODE)
    try:
        if os.write(fd, data) != len(data):
            raise OSError(errno.ENOSPC, "short write while creating an empty segment", path)
        os.fdatasync(fd)
    except OSError:
        # Nobody else can have seen it (the caller holds the lock): leave no half segment.
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    fsutil.fsync_dir(directory)


def highest_segno(directory: str, shard: int) -> int:
    """The highest segment number ``shard`` has used in ``directory``, quarantined ones too; 0 if none."""
    found = list_segments(directory).get(shard, [])
    qdir = os.path.join(directory, QUARANTINE_DIR)
    if os.path.isdir(qdir):
        found = found + list_segments(qdir).get(shard, [])
    return max(found, default=0)


def quarantine(directory: str, shard: int, segno: int) -> str:
    """Move a segment into ``quarantine/`` durably; returns its new path."""
    qdir = os.path.join(directory, QUARANTINE_DIR)
    fsutil.ensure_dir(qdir)
    name = segment_name(shard, segno)
    target = os.path.join(qdir, name)
    os.replace(os.path.join(directory, name), target)
    fsutil.fsync_dir(qdir)
    fsutil.fsync_dir(directory)
    return target
