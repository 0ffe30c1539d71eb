"""Sending jobs to children: how many each is worth, which child takes which, and when.

What a child holds is bounded: at most its ``target`` of jobs and about ``max_bytes`` of
payload sent and not yet reported (one job over the byte budget goes alone), and, across
the pool, at most ``concurrency=K`` jobs of a kind that caps it. The target follows the
child's pace: ``min_jobs``, plus what it finishes in ``horizon_s`` at its recent rate, up
to ``max_jobs``; a child stuck on a slow handler soon holds no more than ``min_jobs``.
Sends never block: frames queue on a non-blocking pipe and go out as the child reads.

Routing: the hash, ``shard_for(id, N)``, picks a job's home child, and a saturated
child's jobs run elsewhere. Jobs beyond what their home child can take wait in the
parent, in its ``held`` queue, and a child with room takes, after its own, the held jobs
of the others. A child with a job sent ``steal_after_s`` ago and not started, while
another child is idle or behind its running handlers while it finished nothing for as
long (they are all busy), is ``recall``ed: its main thread, which always reads the pipe,
takes its unstarted jobs off its lanes and names them (``Returned``; one that started
meanwhile is simply not returned), and they wait in the parent again for a child with
room. It is then *saturated*
(target 0: sent nothing, claimed for by no one) until it reports a job finished after
that, or has nothing left to run. The fast path pays no syscall and no scan per job.

A suspect (``shardworker.worker.deaths``) is sent alone, to a child that holds nothing else.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable

from shardworker.core.model import ClaimedJob
from shardworker.worker.child_handle import ChildHandle
from shardworker.worker.kindcaps import KindCaps

log = logging.getLogger(__name__)


class Sender:
    """Sends the pool's jobs to its children within their targets, bytes and kind caps."""

    def __init__(self, handles: list[ChildHandle], caps: KindCaps, *, max_jobs: int, max_bytes: int,
                 min_jobs: int | None, horizon_s: float, steal_after_s: float, clock: Callable[[], float]) -> None:
        self.handles, self.caps, self.clock = handles, caps, clock
        self.max_jobs, self.max_bytes = max_jobs, max_bytes
        self.min_jobs, self.horizon_s = min(max_jobs, min_jobs or max_jobs), horizon_s
        self.steal_after_s = steal_after_s
        self._next_recall_check = 0.0

    def target(self, handle: ChildHandle, now: float) -> int:
        """Jobs worth holding for ``handle`` at its recent pace; 0 while it is saturated."""
        if handle.saturated:
            return 0
        return min(self.max_jobs, self.min_jobs + int(handle.pace.roll(now) * self.horizon_s))


    def pump(self, handle: ChildHandle, held: collections.deque[ClaimedJob] | None = None) -> int:
        """Send jobs from ``held`` (the child's own by default) while the child has room and
        their kinds are under their caps; returns how many more it could take (0: full, or
        nothing to send)."""
        held = handle.held if held is None else held
        if not held or handle.recalling:
            return 0
        now = self.clock()
        jobs_left = min(self.target(handle, now) - len(handle.sent), handle.free_slots)
        if jobs_left <= 0 or not handle.ready:  # ready (a waitpid) last: this runs every pass
            return 0
        batch: list[ClaimedJob] = []
        sizes: list[int] = []
        skipped: list[ClaimedJob] = []
        bytes_left = self.max_bytes - handle.sent_bytes
        while held and len(batch) < jobs_left:
            job = held[0]
            if self.caps.full(job.kind):
                skipped.append(held.popleft())  # its kind is at its cap: later jobs may go first
                continue
            size = job.size + 64
            if size > bytes_left and (handle.sent or batch):
                jobs_left = len(batch)  # over the byte budget; a job bigger than the budget goes alone
                break
            batch.append(held.popleft())
            sizes.append(size)
            bytes_left -= size
            self.caps.sent(job.kind)
        held.extendleft(reversed(skipped))
        if batch:
            handle.send_now(batch, sizes, now)
        return max(0, jobs_left - len(batch))

    def share(self) -> None:
        """Children with room take the jobs held for children that have none."""
        donors = [h for h in self.handles if h.held]
        if not donors:
            return
        for handle in self.handles:
            for donor in donors:
                if donor is not handle and donor.held and self.pump(handle, donor.held) == 0:
                    break

    def recall_stuck(self) -> None:
        """Recall the unstarted jobs of a child whose oldest unstarted job waited
        ``steal_after_s`` while another child is idle, or behind its own running handlers
        while it finished nothing (they are all busy: its jobs wait here instead, for any
        child with room).

        Looks every ``steal_after_s / 4``; reads a child's slots only when it qualifies."""
        now = self.clock()
        if now < self._next_recall_check:
            return
        self._next_recall_check = now + self.steal_after_s / 4
        idle = any(not h.sent and not h.saturated and h.ready for h in self.handles)
        for handle in self.handles:
            if handle.recalling or not handle.sent:
                continue
            quiet = now - handle.reported_at >= self.steal_after_s
            waiting = handle.waiting_since() if idle or quiet else None
            if waiting is None:
                continue
            since, behind_running = waiting
            # Not behind a running handler: the child is still starting (spawn, app import).
            if now - since >= self.steal_after_s and (idle or behind_running) and handle.ready:
                log.debug("child %d has not started a job in %.1fs: recalling its unstarted jobs", handle.index,
                          now - since)
                handle.recall()

    def send_suspect(self, handle: ChildHandle) -> None:
        """Send the next suspect when the child holds nothing else (and its kind is under its cap)."""
        if not handle.suspects or handle.sent or not handle.started or not handle.alive:
            return
        job = handle.suspects[0]
        if self.caps.full(job.kind):
            return
        handle.suspects.popleft()
        self.caps.sent(job.kind)
        handle.send_suspect(job)
