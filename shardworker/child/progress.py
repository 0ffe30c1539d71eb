"""A child's progress slots, in a file of the outbox directory that every process maps.

``Progress`` has one slot per job in flight: the parent picks the slot when it sends the
job, the child marks it when the handler starts and when it finishes. After a child's death
the parent knows exactly which jobs were started; while it lives, which ones run past their
timeout. The slots live in ``progress-<shard>.bin`` (``ProgressFile``), mapped shared: a
write reaches the page cache at once, so the slots outlive every process of the worker (not
the host), and the next start knows which of the jobs a kill -9 left running had started
(``shardworker.worker.started``). The parent clears a slot only when it gives it to the next
job, after the previous job's outcome was reported durable: at any instant the ids in the
slots include every job whose handler started and whose outcome may not be durable yet.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from dataclasses import dataclass
from typing import Any

from outbox import FILE_MODE, NOFOLLOW

SLOT_BYTES = 8  # each field a native int64


class Progress:
    """One child's slots (``Progress.width(slots)`` int64s).

    Per slot: the job id whose handler started in it (0: none), when it started
    (``time.monotonic()`` in ms, one clock for every process of the host), and 1 once that
    handler finished. The child writes ``begin``/``finish``; the parent ``clear``s a slot
    before giving it to the next job. After the slots, one flag: 1 once the child has
    loaded the app and reads jobs (``up``), so the parent counts no room in a child still
    starting.
    """

    FIELDS = 3

    def __init__(self, array: Any, slots: int) -> None:
        self.array, self.slots = array, slots

    @classmethod
    def width(cls, slots: int) -> int:
        return cls.FIELDS * slots + 1

    @classmethod
    def slots_in(cls, width: int) -> int | None:
        """How many slots an array of ``width`` holds; None when no slot count gives it."""
        slots, extra = divmod(width - 1, cls.FIELDS)
        return slots if width >= 1 and not extra else None

    def mark_up(self) -> None:
        self.array[self.FIELDS * self.slots] = 1

    def mark_starting(self) -> None:
        """The next child is starting: not up until it says so."""
        self.array[self.FIELDS * self.slots] = 0

    @property
    def up(self) -> bool:
        return bool(self.array[self.FIELDS * self.slots])

    def begin(self, slot: int, job_id: int) -> None:
        base = slot * self.FIELDS
        self.array[base + 1] = int(time.monotonic() * 1000)
        self.array[base + 2] = 0
        self.array[base] = job_id

    def finish(self, slot: int) -> None:
        self.array[slot * self.FIELDS + 2] = 1

    def clear(self, slot: int) -> None:
        base = slot * self.FIELDS
        self.array[base] = self.array[base + 1] = self.array[base + 2] = 0

    def started(self, slot: int, job_id: int) -> bool:
        return bool(self.array[slot * self.FIELDS] == job_id)

    def started_ids(self) -> set[int]:
        """The job ids in the slots: handlers that started, outcome maybe not durable."""
        return {self.array[slot * self.FIELDS] for slot in range(self.slots)} - {0}

    def began_at(self, slot: int) -> float:
        """When the handler in ``slot`` started (monotonic s), running or finished."""
        return float(self.array[slot * self.FIELDS + 1]) / 1000

    def running_since(self, slot: int, job_id: int) -> float | None:
        """When the handler of ``job_id`` started (monotonic s), if it runs now in ``slot``."""
        base = slot * self.FIELDS
        if self.array[base] != job_id or self.array[base + 2]:
            return None
        return float(self.array[base + 1]) / 1000


@dataclass(frozen=True)
class ProgressFile:
    """Where one child's slots live: picklable, so a spawned child maps the file itself."""

    path: str
    slots: int

    def open(self) -> Progress:
        """Map the file shared (created 0600 and zeroed when absent, never through a symlink);
        what its slots hold is kept: ids a dead predecessor left go only as slots are reused."""
        width = Progress.width(self.slots)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | NOFOLLOW, FILE_MODE)
        try:
            if os.fstat(fd).st_size != width * SLOT_BYTES:
                os.ftruncate(fd, width * SLOT_BYTES)
            mapped = mmap.mmap(fd, width * SLOT_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return Progress((ctypes.c_int64 * width).from_buffer(mapped), self.slots)  # keeps the mapping alive


def read_started(path: str) -> set[int]:
    """The job ids in the slots of a progress file left by an earlier run; ``ValueError``
    when its size fits no slot count (cut short, or not one)."""
    with open(os.open(path, os.O_RDONLY | NOFOLLOW), "rb") as f:
        data = f.read()
    slots = Progress.slots_in(len(data) // SLOT_BYTES) if len(data) % SLOT_BYTES == 0 else None
    if not slots:
        raise ValueError(f"{path} holds {len(data)} bytes, not a progress file's")
    return Progress((ctypes.c_int64 * (len(data) // SLOT_BYTES)).from_buffer_copy(data), slots).started_ids()
