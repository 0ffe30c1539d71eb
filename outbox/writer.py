"""The shard writer: the only process appending to one shard's segments.

Usage::

    with ShardWriter.open(directory, shard=3) as w:
        w.append({"job": 1, "result": 42})
        w.append({"job": 2, "result": 43})
        w.commit()              # one os.write + one fdatasync: both acknowledged

``commit`` is the group commit: records appended since the last commit are written with
one ``os.write`` and made durable with one ``fdatasync``. Only when it returns are they
acknowledged. On a short write or ENOSPC (``OutboxFull``) or an fsync error
(``OutboxSyncError``) the segment is truncated back to the last acknowledged byte and
abandoned: it is never written again, and the next commit starts a new segment. Either way
the batch is dropped from the writer and nothing in it is acknowledged: the caller decides
what happens to it.

Reclaiming space: the flusher deletes only sealed segments, so a writer seals and starts a
new segment early once the flusher has caught up with it (by the flusher's checkpoint): at a
commit once the segment holds ``reclaim_bytes`` and the flusher reads in it, and in
``reclaim`` (for an idle writer) once all of it is applied. Applied outcomes therefore never
sit in a writer's current segment for long, whatever ``segment_bytes`` is.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time

import orjson

from outbox import checkpoint, fsutil
from outbox.checkpoint import Position
from outbox.errors import OutboxError, OutboxFull, OutboxLocked, OutboxSyncError, OutboxUnserializable
from outbox.frame import HEADER_SIZE, MAX_PAYLOAD_BYTES, Kind, encode, encode_header
from outbox.recovery import highest_segno, recover_shard
from outbox.segment import lock_name, segment_name
from outbox.wake import Poker
from outbox.writer_config import WriterConfig

log = logging.getLogger(__name__)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class ShardWriter:
    """Appends records to one shard; holds that shard's flock while open."""

    def __init__(self, directory: str, shard: int, lock_fd: int, config: WriterConfig) -> None:
        self.directory, self.shard, self.config = directory, shard, config
        self._lock_fd: int | None = lock_fd
        self._fd: int | None = None
        self._segno = -1
        self._size = 0  # bytes acknowledged (durable) in the current segment
        self._seq = 0  # next sequence number in the current segment
        self._pending: list[tuple[int, bytes]] = []  # (ts_ms, payload)
        self._next_check = 0.0  # monotonic time of the next checkpoint read (see reclaim)
        self._poker = Poker(directory)

    @classmethod
    def open(cls, directory: str, shard: int, config: WriterConfig | None = None) -> ShardWriter:
        """Take the shard's lock, recover its last segment, and start a fresh one.

        Raises ``OutboxLocked`` if another live process writes this shard.
        """
        fsutil.ensure_dir(directory)
        lock_fd = fsutil.try_lock(os.path.join(directory, lock_name(shard)))
        if lock_fd is None:
            raise OutboxLocked(f"outbox shard {shard} in {directory} is held by another writer")
        writer = cls(directory, shard, lock_fd, config or WriterConfig())
        try:
            recover_shard(directory, shard)
            writer._start_segment(highest_segno(directory, shard) + 1)
        except BaseException:
            writer.close()
            raise
        return writer

    @property
    def segno(self) -> int:
        return self._segno

    def append(self, value: object) -> None:
        """Queue one record for the next commit.

        Raises ``OutboxUnserializable`` (and queues nothing) if orjson cannot encode it.
        """
        try:
            payload = orjson.dumps(value)
        except TypeError as exc:
            raise OutboxUnserializable(f"outcome is not JSON-serializable: {exc}") from exc
        self.append_bytes(payload)

    def append_bytes(self, payload: bytes) -> None:
        """Queue one record of raw bytes for the next commit.

        Raises ``ValueError`` (and queues nothing) for a payload over ``MAX_PAYLOAD_BYTES``:
        readers would take such a frame for damage.
        """
        if len(payload) > MAX_PAYLOAD_BYTES:
            raise ValueError(f"outbox record of {len(payload)} bytes is over MAX_PAYLOAD_BYTES")
        self._pending.append((_now_ms(), payload))

    @property
    def pending(self) -> int:
        return len(self._pending)

    def commit(self) -> int:
        """Write and fdatasync the queued records with one write; return how many.

        When this returns, every queued record is durable (acknowledged). When it raises,
        none of them is, and the queue is empty. A closed writer raises ``OutboxError``: it
        no longer holds the shard's lock.
        """
        if not self._pending:
            return 0
        pending, self._pending = self._pending, []
        if self._lock_fd is None:
            raise OutboxError(f"outbox writer of shard {self.shard} is closed")
        size = sum(HEADER_SIZE + len(p) for _, p in pending)
        if self._fd is None:
            # The last segment was abandoned after a failed write or fsync: never reuse it.
            # Check the room first: a full disk must not leave a new empty segment per retry.
            self._check_room(size + self.config.reserve_bytes)
            self._start_segment(self._segno + 1)
        if self._seq > 1 and (self._size + size > self.config.segment_bytes or self._flusher_caught_up()):
            self.seal()
            self._start_segment(self._segno + 1)
        # Headers and payloads go out side by side (writev): a big payload is never copied.
        parts: list[bytes] = []
        for i, (ts, p) in enumerate(pending):
            parts.append(encode_header(self.shard, self._segno, Kind.DATA, self._seq + i, ts, p))
            parts.append(p)
        self._write_durably(parts, keep_reserve=True)
        self._seq += len(pending)
        self._poker.poke()  # the reader waits on it rather than polling (outbox.wake)
        return len(pending)

    def _write_durably(self, data: bytes | list[bytes], *, keep_reserve: bool = False) -> None:
        """One write (of the joined ``data``) and one fdatasync. Records keep
        ``reserve_bytes`` free; a seal or header may use that reserve, which is what it is for."""
        assert self._fd is not None, "writer is closed or abandoned"
        parts = [data] if isinstance(data, bytes) else data
        size = sum(len(p) for p in parts)
        self._check_room(size + (self.config.reserve_bytes if keep_reserve else 0))
        try:
            written = fsutil.write_all_once(self._fd, parts)  # a short count is checked below
        except OSError as exc:
            self._cut_and_abandon()
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise OutboxFull(f"outbox disk full in {self.directory}: {exc.strerror}") from exc
            raise
        if written != size:
            self._cut_and_abandon()
            raise OutboxFull(f"outbox disk full in {self.directory}: short write "
                             f"({written} of {size} bytes)")
        try:
            os.fdatasync(self._fd)
        except OSError as exc:
            self._cut_and_abandon()
            raise OutboxSyncError(f"fdatasync failed on outbox shard {self.shard} segment "
                                  f"{self._segno}: {exc}; segment abandoned") from exc
        self._size += size

    def reclaim(self) -> bool:
        """For an idle writer: seal the current segment and start the next when it holds
        records and the flusher's checkpoint says every one of them is applied, so the
        flusher can delete it. True if it did. Never raises for a full disk or a failed
        fsync (the records were applied already): the segment stays, or is abandoned and
        the next commit starts another."""
        if self._fd is None or self._seq <= 1 or self._pending:
            return False
        pos = self._checkpointed()
        if pos is None or pos.segno != self._segno or pos.offset < self._size:
            return False
        try:
            self.seal()
            self._start_segment(self._segno + 1)
        except (OutboxError, OSError) as exc:
            log.warning("could not rotate applied outbox shard %s segment %s: %s", self.shard, self._segno, exc)
            return False
        return True

    def _flusher_caught_up(self) -> bool:
        """Whether the segment holds ``reclaim_bytes`` and the flusher is reading it: all
        older segments applied, so this one goes soon after it is sealed."""
        if self._size < self.config.reclaim_bytes:
            return False
        pos = self._checkpointed()
        return pos is not None and pos.segno == self._segno

    def _checkpointed(self) -> Position | None:
        """This shard's position in the flusher's checkpoint, read at most every
        ``reclaim_check_s`` (None in between, or when there is none)."""
        now = time.monotonic()
        if now < self._next_check:
            return None
        self._next_check = now + self.config.reclaim_check_s
        try:
            return checkpoint.load(self.directory).get(self.shard)
        except OSError:
            return None  # an unreadable hint only delays reclaiming

    def _check_room(self, nbytes: int) -> None:
        if fsutil.free_bytes(self.directory) < nbytes:
            raise OutboxFull(f"outbox disk nearly full in {self.directory}: less than "
                             f"{nbytes} bytes free")

    def _cut_and_abandon(self) -> None:
        """After a failed write or fsync: cut the segment back to its last acknowledged byte
        (best effort) and never write it again.

        Never again, because a concurrent reader may already have read whole frames of the
        failed batch: its cursor is past them, and other frames written at those offsets
        would be misread or skipped. Cut, because after an fsync error the kernel may have
        dropped the batch's pages while they still read back from cache: left in place,
        recovery would seal after them with an fdatasync that succeeds without writing
        them, leaving zeros before a seal, a corrupt segment, and its acknowledged records
        quarantined.
        """
        assert self._fd is not None
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, self._size)
        self._abandon()

    def _abandon(self) -> None:
        """Stop using the current segment; the next commit opens a new one."""
        if self._fd is not None:
            os.close(self._fd)
        self._fd = None

    def seal(self) -> None:
        """Append a SEAL frame (durably) and close the segment: it is never written again."""
        if self._fd is None:
            return
        frame = encode(self.shard, self._segno, Kind.SEAL, self._seq, _now_ms(), b"")
        self._write_durably(frame)
        self._seq += 1
        os.close(self._fd)
        self._fd = None

    def _start_segment(self, segno: int) -> None:
        """Create segment ``segno`` with a durable header, or abandon it and raise.

        Abandoning matters: a record written after a failed header would sit where the
        header belongs, and recovery would quarantine the segment, acknowledged records and all.
        """
        name = segment_name(self.shard, segno)
        fd = os.open(os.path.join(self.directory, name),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | fsutil.NOFOLLOW, fsutil.FILE_MODE)
        self._fd, self._segno, self._size, self._seq = fd, segno, 0, 0
        try:
            # The directory entry must be durable before any record in it is acknowledged.
            fsutil.fsync_dir(self.directory)
            self._write_durably(encode(self.shard, segno, Kind.HEADER, 0, _now_ms(), b""))
        except BaseException:
            self._abandon()
            raise
        self._seq = 1

    def close(self) -> None:
        """Seal the current segment (best effort) and release the shard lock."""
        self._pending = []
        try:
            if self._fd is not None:
                self.seal()
        except (OSError, OutboxFull, OutboxSyncError) as exc:
            # Unsealed is safe: the next writer of this shard recovers and seals it.
            log.warning("could not seal outbox shard %s segment %s: %s", self.shard, self._segno, exc)
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
            self._poker.close()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
