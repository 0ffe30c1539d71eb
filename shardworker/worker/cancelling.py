"""Jobs an operator cancelled while this worker holds them (``shardworker jobs cancel``).

The database already says ``cancelled``: whatever outcome the attempt ends with is fenced
out when it is applied. What is left is to stop the work. The pool marks the jobs here;
each is told to the child that holds it (``wire.CancelJobs``; a job still waiting in the
parent is told once it is sent, and told again after its child restarts, or after it was
taken back and sent again, even to the same child: a child forgets the jobs it gives back,
cancels and all); a handler that
has not stopped ``grace_s`` after being told is *overdue*, and its child is stopped the
way a timeout stops it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from shardworker.core import logs, wire
from shardworker.worker.child_handle import ChildHandle

log = logging.getLogger(__name__)


class Cancelling:
    """The cancelled jobs still held, when each was told to which child."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        # key: (the handle, its process object, when) it was told; None: not yet
        self._told: dict[wire.JobKey, tuple[ChildHandle, object, float] | None] = {}

    def __bool__(self) -> bool:
        return bool(self._told)

    def __contains__(self, key: object) -> bool:
        return key in self._told

    def add(self, keys: Iterable[wire.JobKey]) -> int:
        """Mark ``keys`` cancelled; how many were not already."""
        new = [key for key in keys if key not in self._told]
        for key in new:
            self._told[key] = None
        return len(new)

    def keep_only(self, held: set[wire.JobKey]) -> None:
        """Forget the jobs no longer held (reported, given back, settled after a death)."""
        for key in self._told.keys() - held:
            del self._told[key]

    def tell(self, handles: Iterable[ChildHandle], now: float) -> None:
        """Send each cancelled job's child a ``CancelJobs`` unless that process was told already,
        since the job was last sent to it."""
        for handle in handles:
            if not handle.alive:
                continue
            process = handle.process  # a restarted child is a new process object: tell it again
            fresh = [key for key in self._told.keys() & handle.sent.keys()
                     if (told := self._told[key]) is None or told[0] is not handle or told[1] is not process
                     or told[2] < handle.sent[key].at]
            for key in fresh:
                self._told[key] = (handle, process, now)
            if fresh:
                handle.put(wire.CancelJobs(tuple(fresh)))

    def overdue(self, handle: ChildHandle, now: float) -> dict[wire.JobKey, str]:
        """The running jobs of ``handle`` told more than ``grace_s`` ago, with their error."""
        if not self._told:
            return {}
        late = {}
        for job, _ in handle.running():
            told = self._told.get((job.id, job.attempt))
            if told is not None and told[0] is handle and now - told[2] > self.grace_s:
                log.error("job %d (%s) was cancelled and its handler did not stop within %gs; stopping child %d",
                          job.id, job.kind, self.grace_s, handle.index, extra=logs.job_fields(job))
                late[(job.id, job.attempt)] = f"cancelled by an operator; stopped after {self.grace_s:g}s"
        return late
