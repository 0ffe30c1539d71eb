"""The cancel flags of the jobs a child holds: an operator's ``jobs cancel`` of a running job.

The parent tells the child (``wire.CancelJobs``) once the database says the job is
cancelled; the child sets the job's flag. A sync or threaded handler sees it as
``job.cancelled``; an ``async def`` handler's task is cancelled (its lane does that); a job
not started yet never starts. Past the worker's ``--cancel-grace`` the parent stops the
child, as for a timeout.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from shardworker.core.wire import JobKey

OPERATOR_CANCEL = "cancelled by an operator"  # the error of an attempt cancelled while it ran


class Flag:
    """A job's cancel flag: set once by the child's main thread, read by its handler.

    Nobody waits on it (a handler polls ``job.cancelled``; an async handler's task is
    cancelled), so a plain attribute does, where a ``threading.Event`` would build a
    condition and a lock for each job a child is given."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


class Cancels:
    """One ``Flag`` per job the child holds, by (id, attempt)."""

    def __init__(self) -> None:
        self._flags: dict[JobKey, Flag] = {}
        self._lock = threading.Lock()

    def hold(self, key: JobKey) -> Flag:
        """The flag of a job the child was given (made at the first call)."""
        with self._lock:
            flag = self._flags.get(key)
            if flag is None:
                flag = self._flags[key] = Flag()
            return flag

    def cancel(self, keys: Iterable[JobKey]) -> list[JobKey]:
        """Set the flags of the jobs held among ``keys``; returns those."""
        with self._lock:
            held = [key for key in keys if key in self._flags]
            for key in held:
                self._flags[key].set()
        return held

    def release(self, keys: Iterable[JobKey]) -> None:
        """Forget jobs the child no longer holds (finished, returned, never started)."""
        with self._lock:
            for key in keys:
                self._flags.pop(key, None)
