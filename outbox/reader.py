"""The reader: the flusher's side of the outbox.

Usage::

    with OutboxReader.open(directory) as reader:   # takes the directory's flusher lock
        records = reader.poll(500)                 # unflushed records, in order per shard
        apply_to_database(records)                 # caller commits them
        reader.mark_flushed(records)               # only after the commit
        reader.checkpoint()                        # durable; deletes fully flushed segments

The reader follows segments still being written, covers shards that no longer have a
writer (recovering and sealing their last segment), and quarantines corrupt segments
(logged, and listed by ``status``). ``checkpoint`` reclaims space: it deletes every sealed,
fully flushed segment but each shard's newest (or, with a ``Keep``, those of them past the
kept window: ``outbox.tail``), and when a shard without a live writer has all of its newest
segment flushed, it seals that one and puts an empty sealed segment after it, so the next
``checkpoint`` deletes it too (numbers never go backwards). ``rewind`` moves shards back to
earlier positions, into the kept tail, to read (and apply) those records again.
``mark_flushed`` must receive records in the order ``poll`` returned them, per shard.
Each shard's read state, the poll budget and the reading of frames are in ``outbox.cursor``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

from outbox import checkpoint, fsutil
from outbox.checkpoint import Position
from outbox.cursor import Budget, Record, ShardState, read_frames
from outbox.errors import OutboxLocked
from outbox.frame import HEADER_SIZE
from outbox.recovery import RecoveryEvent, quarantine, recover_shard, retire_shard
from outbox.segment import State, list_segments, lock_name, parse, read_file, segment_name
from outbox.tail import Finished, Keep, Tail
from outbox.wake import Listener

log = logging.getLogger(__name__)

FLUSHER_LOCK = "flusher.lock"
FIRST_SEGNO = 1  # a shard's first segment (outbox.writer: one past the highest, 0 when none)


class OutboxReader:
    """Reads unflushed records of every shard in one outbox directory."""

    def __init__(self, directory: str, lock_fd: int, keep: Keep | None = None) -> None:
        self.directory = directory
        self._lock_fd: int | None = lock_fd
        self._shards: dict[int, ShardState] = {}
        self._next_start = 0
        self._moved = False  # a flushed position crossed a segment since the last checkpoint
        self._listener = Listener(directory)  # writers' commits wake ``wait``
        self._tail = Tail(directory, keep or Keep())
        for shard, pos in checkpoint.load(directory).items():
            self._shards[shard] = ShardState(pos, pos)
        # What the caller kept with the last checkpoint (``checkpoint(note=...)``); {} before the first.
        self.note: dict[str, object] = checkpoint.load_note(directory)

    @classmethod
    def open(cls, directory: str, keep: Keep | None = None) -> OutboxReader:
        """Take the directory's flusher lock; ``OutboxLocked`` if another flusher has it.
        ``keep``: how much of the applied tail to keep (``outbox.tail``; default none)."""
        fsutil.ensure_dir(directory)
        fsutil.check_contents(directory)  # what it reads it applies: nothing another account wrote
        lock_fd = fsutil.try_lock(os.path.join(directory, FLUSHER_LOCK))
        if lock_fd is None:
            raise OutboxLocked(f"another flusher or worker holds the outbox {directory}")
        try:
            return cls(directory, lock_fd, keep)
        except BaseException:
            os.close(lock_fd)
            raise

    def poll(self, max_records: int, max_bytes: int | None = None) -> list[Record]:
        """Up to ``max_records`` records not yet returned, in order within each shard, and
        no more than ``max_bytes`` of payload in all (but always one record, however big,
        when any is waiting)."""
        segments = list_segments(self.directory)
        for shard in segments:
            self._shards.setdefault(shard, ShardState(Position(0, 0, 0), Position(0, 0, 0)))
        order = sorted(self._shards)
        if not order:
            return []
        start = self._next_start % len(order)
        self._next_start += 1
        budget = Budget.of(max_records, max_bytes)
        out: list[Record] = []
        for shard in order[start:] + order[:start]:
            if budget.spent:
                break
            out.extend(self._read_shard(shard, segments.get(shard, []), budget))
        return out

    def _read_shard(self, shard: int, segs: list[int], budget: Budget) -> list[Record]:
        state = self._shards[shard]
        out: list[Record] = []
        while not budget.spent:
            current = [s for s in segs if s >= state.cursor.segno]
            if not current:
                return out
            if current[0] != state.cursor.segno:  # segment gone (quarantined) or first read
                self._cross(state, current[0])
            records, stop = self._read_segment(shard, state, budget)
            out.extend(records)
            if stop == "more":
                continue
            if stop == "sealed" or (stop == "end" and len(current) > 1):
                nxt = current[1] if len(current) > 1 else state.cursor.segno + 1
                self._cross(state, nxt)
                if len(current) == 1:
                    return out
                continue
            if stop == "damage" and self._handle_damage(shard, state, segs):
                segs = list_segments(self.directory).get(shard, [])
                continue
            return out
        return out

    def _cross(self, state: ShardState, segno: int) -> None:
        """Move the read cursor to the start of segment ``segno``."""
        self._close_fd(state)
        state.cursor = Position(segno, 0, 0)
        if state.inflight:
            state.inflight.append(state.cursor)
        else:
            state.flushed = state.cursor
            self._moved = True

    def _read_segment(self, shard: int, state: ShardState, budget: Budget) -> tuple[list[Record], str]:
        """Read frames at the cursor; stop reason: more, sealed, end, damage or budget."""
        fd = self._fd_for(shard, state)
        if fd is None:
            return [], "end"
        return read_frames(fd, shard, state, budget)

    def _fd_for(self, shard: int, state: ShardState) -> int | None:
        if state.fd is None or state.fd_segno != state.cursor.segno:
            self._close_fd(state)
            path = os.path.join(self.directory, segment_name(shard, state.cursor.segno))
            try:
                state.fd = os.open(path, os.O_RDONLY | fsutil.NOFOLLOW)
            except FileNotFoundError:
                return None
            state.fd_segno = state.cursor.segno
        return state.fd

    def _handle_damage(self, shard: int, state: ShardState, segs: list[int]) -> bool:
        """Invalid bytes at the cursor. True if the shard's segments changed and can be re-read."""
        segno = state.cursor.segno
        if segno != segs[-1]:
            return self._handle_finished_damage(shard, state, segs)
        lock_fd = fsutil.try_lock(os.path.join(self.directory, lock_name(shard)))
        if lock_fd is None:
            return False  # the live writer is mid-write, or damage waits for it to finish
        try:
            events = recover_shard(self.directory, shard)
        finally:
            os.close(lock_fd)
        self._close_fd(state)
        return bool(events)

    def _handle_finished_damage(self, shard: int, state: ShardState, segs: list[int]) -> bool:
        """Damage in a segment its writer left: quarantine if corrupt, else treat as ended."""
        segno = state.cursor.segno
        scan = parse(read_file(os.path.join(self.directory, segment_name(shard, segno))), shard, segno)
        self._close_fd(state)
        if scan.state is State.CORRUPT:
            quarantine(self.directory, shard, segno)
            event = RecoveryEvent(shard, segno, "quarantined", scan.bad_offset or 0, scan.reason)
            log.error("outbox shard %s segment %s quarantined at offset %s: %s",
                      shard, segno, event.offset, event.detail)
        # Otherwise the writer abandoned it after a failed fsync: its valid prefix is all.
        self._cross(state, segs[segs.index(segno) + 1])
        return True

    def mark_flushed(self, records: list[Record]) -> None:
        """Record that ``records`` are committed in the database (in poll order per shard)."""
        for rec in records:
            state = self._shards[rec.shard]
            expected = state.inflight.popleft()
            if (expected.segno, expected.offset) != (rec.segno, rec.end):
                raise ValueError("mark_flushed records must come in poll order per shard")
            state.flushed = expected
            while state.inflight and state.inflight[0].offset == 0:
                state.flushed = state.inflight.popleft()

    def shards_on_disk(self) -> list[int]:
        """The shards that have segments in the directory."""
        return sorted(list_segments(self.directory))

    def flushed_positions(self) -> dict[int, Position]:
        """Per shard, the first record not yet flushed (where ``rewind`` would bring it back from)."""
        return {shard: state.flushed for shard, state in self._shards.items()}

    @property
    def wants_checkpoint(self) -> bool:
        """Whether a segment was passed since the last ``checkpoint`` without any record
        being flushed (a seal or an empty segment): one is due to reclaim it."""
        return self._moved

    def checkpoint(self, note: dict[str, object] | None = None) -> int:
        """Delete finished segments (past the kept tail), then save flushed positions durably,
        with ``note`` (the caller's, read back as ``note`` by the next reader; the last one
        when None); returns deletions.

        Deleting first frees space on a full disk before the checkpoint needs some; a crash
        in between leaves an older checkpoint that may name a deleted segment, which the
        next reader steps over (everything in it was flushed)."""
        if note is not None:
            self.note = note
        segments = list_segments(self.directory)
        deleted = self._delete_finished(segments)
        checkpoint.save(self.directory, {k: s.flushed for k, s in self._shards.items()}, self.note)
        self._moved = False
        for shard, segs in segments.items():
            self._retire_if_applied(shard, segs[-1])
        return deleted

    def _finished(self, segments: dict[int, list[int]]) -> list[Finished]:
        """Sealed segments whose records are all flushed: every one before its shard's flushed
        position but the shard's newest (so segment numbers never go backwards)."""
        found: list[Finished] = []
        for shard, segs in segments.items():
            state = self._shards.get(shard)
            if state is None:
                continue
            for segno in segs[:-1]:
                if segno < state.flushed.segno and (f := self._tail.finished(shard, segno)) is not None:
                    found.append(f)
        return found

    def _delete_finished(self, segments: dict[int, list[int]]) -> int:
        doomed = self._tail.to_delete(self._finished(segments), time.time())
        for f in doomed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.directory, segment_name(f.shard, f.segno)))
        self._tail.forget(doomed)
        if doomed:
            fsutil.fsync_dir(self.directory)
        return len(doomed)

    def rewind(self, targets: dict[int, Position | None]) -> dict[int, bool]:
        """Move shards back to read again from a flushed position (None: from the shard's start),
        into the kept tail; the next ``poll`` returns those records again. Per shard, whether
        its target was still there: False when the records from it to the oldest kept one are
        gone (deleted past the window), and reading restarts at the oldest kept.
        Records polled and not yet marked flushed are dropped: they come again too."""
        for state in self._shards.values():
            if state.inflight or state.cursor != state.flushed:
                self._close_fd(state)
                state.inflight.clear()
                state.cursor = state.flushed
        segments = list_segments(self.directory)
        whole: dict[int, bool] = {}
        for shard, target in targets.items():
            segs = segments.get(shard, [])
            if not segs:
                whole[shard] = True  # nothing of it is left, nor was anything to read again
                continue
            state = self._shards.setdefault(shard, ShardState(Position(0, 0, 0), Position(0, 0, 0)))
            if target is not None and target.segno in segs:
                position, whole[shard] = target, True
            else:  # from the oldest kept: whole only if nothing of the shard was ever deleted
                later = [s for s in segs if target is None or s > target.segno]
                position = Position(later[0] if later else segs[-1], 0, 0)
                whole[shard] = target is None and segs[0] <= FIRST_SEGNO
            if position < state.flushed:
                self._close_fd(state)
                state.cursor = state.flushed = position
                self._moved = True
        return whole

    def _retire_if_applied(self, shard: int, last: int) -> None:
        """Seal ``last``, the newest segment of ``shard``, and start an empty one after it,
        when it holds records, all of them are flushed, and no writer holds the shard."""
        state = self._shards.get(shard)
        if state is None or state.inflight or state.flushed != state.cursor:
            return  # records of it in hand, not yet flushed
        if state.cursor.segno not in (last, last + 1):
            return  # not read up to it yet
        try:
            size = os.lstat(os.path.join(self.directory, segment_name(shard, last))).st_size
        except FileNotFoundError:
            return
        if size <= 2 * HEADER_SIZE or (state.cursor.segno == last and state.cursor.offset < size):
            return  # no record in it (an empty one is what retiring leaves), or some unread
        try:
            # The next poll passes both; the next checkpoint deletes ``last``. A cursor past
            # ``last`` crossed its seal (``last`` is the newest segment).
            retire_shard(self.directory, shard, last, sealed=state.cursor.segno == last + 1)
        except OSError as exc:
            log.warning("could not retire applied outbox shard %s segment %s yet: %s", shard, last, exc)

    def _close_fd(self, state: ShardState) -> None:
        if state.fd is not None:
            os.close(state.fd)
            state.fd, state.fd_segno = None, -1

    @property
    def waking(self) -> bool:
        """Whether writers' commits wake ``wait`` (else it only sleeps)."""
        return self._listener.listening

    def wait(self, timeout_s: float) -> bool:
        """Until a writer commits (``outbox.wake``) or ``timeout_s`` passes; True when woken."""
        return self._listener.wait(timeout_s)

    def close(self) -> None:
        self._listener.close()
        for state in self._shards.values():
            self._close_fd(state)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> OutboxReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
