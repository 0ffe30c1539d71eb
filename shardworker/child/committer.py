"""The child's group commit, on a thread of its own.

Handlers (whichever lane runs them) hand finished outcomes to ``add``, the step records
of ``job.step`` to ``add_step`` (an ``async def`` handler's) or ``commit_step`` (a thread's),
and progress records to ``add_note`` (nobody waits for them);
the committer writes the waiting ones with one write and one fdatasync
(``ShardWriter.commit``) and only then wakes the steps' callers and reports the outcomes to
the parent (``Done``). It commits as soon as

* a step waits (its handler is blocked until the record is durable), or
* ``max_records`` outcomes, or ``max_bytes`` of them, wait, or
* the oldest waiting outcome's handler started ``max_delay_s`` ago (so a slow handler's
  outcome goes out at once, and a fast one never waits on a slow one still running), or
* nothing else is running or queued in the child (no reason to wait), or
* it is asked to stop.

While one commit's fdatasync runs, the next outcomes gather: concurrent completions share
one commit. A handler thread that waits for its step record commits the waiting records
itself (``commit_step``) rather than waking the committer's thread and waiting to be woken
back: two thread hand-offs cost a sync step ten times its fdatasync. Commits take turns
(one at a time), and each takes the records waiting when its turn starts, so records reach
the shard in the order they were added; threads whose records wait behind a running commit
share the next one. When ``max_bytes`` of outcomes already wait behind a running commit, ``add``
blocks until that commit is done: handlers faster than the disk wait for it, instead of
outcomes piling up in memory. On a full disk the batch is kept and retried every second (the parent stops
claiming meanwhile); any other outbox error is fatal for the unsynced outcomes: the child
exits, and those jobs run again under a new attempt.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from outbox import OutboxError, OutboxFull, ShardWriter
from shardworker.core.jobstats import Stat
from shardworker.core.wire import JobKey

log = logging.getLogger(__name__)


class Entry(NamedTuple):
    """A record waiting for the next commit: an outcome's (with its job's key) or a step's
    (``key`` None, ``on_durable`` to call once it is fsync'd)."""

    key: JobKey | None
    record: bytes
    stats: Sequence[Stat]
    on_durable: Callable[[], None] | None = None
    by_caller: bool = False  # its handler's thread commits it (commit_step), not the committer's

FULL_DISK_RETRY_S = 1.0
STEPS_REPORT_S = 0.5  # how often a commit of steps alone is reported (their counts; no job finished)
IDLE_RECLAIM_S = 1.0  # how often an idle committer offers the writer to rotate an applied segment


class Committer:
    """Group commit for one shard writer; ``report`` receives the keys of each durable batch
    and the ``Stat`` each outcome was added with (for the metrics)."""

    def __init__(self, writer: ShardWriter, report: Callable[[list[JobKey], list[Stat]], None], *, max_records: int,
                 max_delay_s: float, max_bytes: int = 8 * 1024 * 1024,
                 on_fatal: Callable[[OutboxError], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.writer, self.report, self.on_fatal = writer, report, on_fatal
        self.max_records, self.max_bytes, self.max_delay_s, self.clock = max_records, max_bytes, max_delay_s, clock
        self._cond = threading.Condition()
        self._waiting: list[Entry] = []
        self._waiting_bytes = 0
        self._oldest_start = 0.0  # handler start of the oldest waiting outcome
        self._unreported: list[Stat] = []  # counts of step-only commits not yet reported
        self._reported_at = 0.0
        self._unfinished = 0  # jobs received and not yet finished
        self._stopping = False
        self._step_waits = False  # an async handler waits for a step record among those waiting
        self._committing = False  # a thread has the turn to commit (one commit at a time, in order)
        self.error: OutboxError | None = None  # set when a commit failed for good
        self._thread = threading.Thread(target=self._run, name="shardworker-commit", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def expect(self, jobs: int) -> None:
        """``jobs`` more were received (each will be ``add``-ed or ``forget``-ed)."""
        with self._cond:
            self._unfinished += jobs

    def forget(self, jobs: int) -> None:
        """``jobs`` received will never run (a stop came first)."""
        with self._cond:
            self._unfinished -= jobs
            self._cond.notify_all()

    def add(self, key: JobKey, record: bytes, started_at: float, stats: Sequence[Stat] = ()) -> None:
        """A finished job's outcome record; ``started_at`` is when its handler started."""
        with self._cond:
            self._wait_for_room()
            earlier = not self._waiting or started_at < self._oldest_start
            if earlier:
                self._oldest_start = started_at  # the deadline moved: the committer must look again
            self._waiting.append(Entry(key, record, stats))
            self._waiting_bytes += len(record)
            self._unfinished -= 1
            if earlier or self._due():
                self._cond.notify_all()

    def add_step(self, record: bytes, on_durable: Callable[[], None], stats: Sequence[Stat] = ()) -> None:
        """A step's record, committed at once (with whatever else waits); ``on_durable`` is
        called on the committer's thread once it is fsync'd."""
        with self._cond:
            self._wait_for_room()
            if not self._waiting:
                self._oldest_start = self.clock()
            self._waiting.append(Entry(None, record, stats, on_durable))
            self._waiting_bytes += len(record)
            self._step_waits = True
            self._cond.notify_all()

    def add_note(self, record: bytes) -> None:
        """A record nobody waits for (``job.progress``): it goes with the next commit, which the
        usual deadline (``max_delay_s`` after it came) brings when nothing else does."""
        with self._cond:
            self._wait_for_room()
            if not self._waiting:
                self._oldest_start = self.clock()
                self._cond.notify_all()  # the committer's wait now has a deadline
            self._waiting.append(Entry(None, record, ()))
            self._waiting_bytes += len(record)

    def commit_step(self, record: bytes, stats: Sequence[Stat] = ()) -> None:
        """A step's record from a handler thread, which commits it (with whatever else waits)
        itself unless another commit takes it first; returns once it is fsync'd. Raises the
        ``OutboxError`` that makes the child exit when the outbox cannot take it."""
        durable = threading.Event()
        with self._cond:
            self._wait_for_room()
            if not self._waiting:
                self._oldest_start = self.clock()
            self._waiting.append(Entry(None, record, stats, durable.set, by_caller=True))
            self._waiting_bytes += len(record)
        while (batch := self._turn(durable)) is not None:
            self._commit_turn(batch)

    def _wait_for_room(self) -> None:
        while self._waiting_bytes >= self.max_bytes and self.error is None and self._thread.is_alive():
            self._cond.wait(0.5)

    def _due(self) -> bool:
        return bool(self._waiting) and (self._step_waits or len(self._waiting) >= self.max_records
                                        or self._unfinished <= 0
                                        or self._waiting_bytes >= self.max_bytes
                                        or self._stopping
                                        or self.clock() - self._oldest_start >= self.max_delay_s)

    def stop(self) -> None:
        """Commit what waits, then end the thread (a fatal commit error stays in ``error``)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        try:
            while (due := self._await_due()) is not None:
                batch = self._turn(None)
                # Idle: no commit will rotate an applied segment, so offer it here (the
                # flusher can delete only sealed segments).
                self._commit_turn(batch or [], reclaim=not due and not batch)
            if self._unreported:
                self.report([], self._unreported)
        except OutboxError as exc:
            if self.error is None:  # else _commit_turn has dealt with it
                self._fatal(exc)

    def _await_due(self) -> bool | None:
        """Wait until a commit is due: True then, None once stopped and empty, False after
        ``IDLE_RECLAIM_S`` with nothing waiting."""
        with self._cond:
            while not self._due():
                if self._stopping and not self._waiting:
                    return None
                if not self._waiting:
                    if not self._cond.wait(IDLE_RECLAIM_S):
                        return False
                    continue
                self._cond.wait(max(0.0, self._oldest_start + self.max_delay_s - self.clock()))
            return True

    def _turn(self, durable: threading.Event | None) -> list[Entry] | None:
        """Wait until no commit runs, then take the turn to commit and the next batch of what
        waits (maybe empty). A step's caller (``durable``) gets None instead once its record
        is durable: it waited for the turn without holding anything up, and another commit
        took its record."""
        with self._cond:
            while self._committing and not (durable is not None and durable.is_set()):
                self._cond.wait()
            if durable is not None and durable.is_set():
                return None
            if self.error is not None:
                raise self.error
            self._committing = True
            batch, self._waiting = self._take()
            self._step_waits = any(e.on_durable is not None and not e.by_caller for e in self._waiting)
            self._cond.notify_all()  # room for handlers waiting in add
            if self._waiting:
                self._oldest_start = 0.0  # unknown for the rest: commit them next, without waiting
            return batch

    def _commit_turn(self, batch: list[Entry], *, reclaim: bool = False) -> None:
        """Commit ``batch`` (or offer the writer to reclaim a segment) and end the turn. An
        ``OutboxError`` is kept in ``error``, logged, handed to ``on_fatal`` and raised."""
        try:
            if batch:
                self._commit(batch)
            elif reclaim:
                self.writer.reclaim()
        except OutboxError as exc:
            self._fatal(exc)
            raise
        finally:
            with self._cond:
                self._committing = False
                self._cond.notify_all()  # the next turn, steps made durable, room for adds

    def _fatal(self, exc: OutboxError) -> None:
        self.error = exc
        log.error("outbox failure, exiting so unacknowledged jobs run again: %s", exc)
        if self.on_fatal is not None:
            self.on_fatal(exc)

    def _take(self) -> tuple[list[Entry], list[Entry]]:
        """The next batch (up to ``max_records`` and ``max_bytes``, at least one) and the rest."""
        size = count = 0
        while count < min(self.max_records, len(self._waiting)) and size < self.max_bytes:
            size += len(self._waiting[count].record)
            count += 1
        self._waiting_bytes -= size
        return self._waiting[:count], self._waiting[count:]

    def _commit(self, batch: list[Entry]) -> None:
        warned = False
        while True:
            for entry in batch:
                self.writer.append_bytes(entry.record)
            try:
                self.writer.commit()
                break
            except OutboxFull as exc:
                if not warned:
                    log.error("%s; holding %d records until space returns", exc, len(batch))
                    warned = True
                time.sleep(FULL_DISK_RETRY_S)
        for entry in batch:
            if entry.on_durable is not None:
                entry.on_durable()
        keys = [entry.key for entry in batch if entry.key is not None]
        self._unreported.extend(stat for entry in batch for stat in entry.stats)
        now = self.clock()
        if keys or now - self._reported_at >= STEPS_REPORT_S:  # steps alone: their counts wait a little
            stats, self._unreported, self._reported_at = self._unreported, [], now
            self.report(keys, stats)
