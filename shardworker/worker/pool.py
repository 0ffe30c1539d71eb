"""The child pool: the parent's side of its child processes.

It starts N children, sends them jobs, collects what they report, notices deaths and
handler timeouts, settles a dead child's jobs and restarts it (with a backoff that never
blocks the caller, and a ``CrashLoop`` verdict for a child that keeps dying at once). It
returns plain results and never touches the database: the dispatcher writes the failures
of lost jobs and counts what was settled. Which child gets which job and how many each
holds (targets at its pace, held queues, sharing, recalls) is ``sending``'s to say.

After a death, ``shardworker.worker.deaths`` sorts and judges what the child held (a job
whose cause is unknown becomes a *suspect*, run alone when claimed again). A death a job
caused restarts the child at once; only one with no job running, or a ``Fatal`` report,
counts toward the crash-loop verdict. The per-kind caps live in ``shardworker.worker.kindcaps``.
A child's life (starting, up, draining, stopped, dead, retired) is its handle's
(``shardworker.worker.child_handle.Life``): the pool asks it, and moves it only through the
handle's methods (``died``, ``retire``, ``start``).
"""

from __future__ import annotations

import collections
import ctypes
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping

from shardworker.app import HandlerSpec
from shardworker.core import procs, wire
from shardworker.core.config import ChildConfig
from shardworker.core.jobstats import JobCounts
from shardworker.core.model import ClaimedJob
from shardworker.errors import CrashLoop
from shardworker.worker import blame
from shardworker.worker.cancel_watch import matching
from shardworker.worker.cancelling import Cancelling
from shardworker.worker.child_handle import ChildHandle, Sent
from shardworker.worker.deaths import Death, Suspects, Timeouts, leftovers, log_death, shutdown_cause
from shardworker.worker.kindcaps import KindCaps
from shardworker.worker.sending import Sender

log = logging.getLogger(__name__)


class ChildPool:
    """The children of one worker."""

    def __init__(self, configs: Iterable[ChildConfig], specs: Mapping[str, HandlerSpec], *, max_jobs: int,
                 max_bytes: int, min_jobs: int | None = None, horizon_s: float = 0.0,
                 steal_after_s: float = 0.5, at_once: int = 1, cancel_grace_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.job_counts = JobCounts()  # finished jobs by kind and outcome, as the children report them
        # Until when (boot-time clock, wall clock) the children may start what they hold: the heartbeat moves it on.
        self._alive_until = procs.context(True).RawArray(ctypes.c_double, [math.inf, math.inf])
        self.handles = [ChildHandle(config, job_counts=self.job_counts, alive_until=self._alive_until)
                        for config in configs]
        self.specs, self.clock = specs, clock
        self.at_once = at_once  # handlers one child runs at once
        self.caps = KindCaps(specs)
        self.timeouts = Timeouts(specs)
        # The kinds whose handler sets max_attempts: a claim makes it their jobs' at the first claim.
        self.attempts = {kind: spec.max_attempts for kind, spec in specs.items() if spec.max_attempts is not None}
        self.sender = Sender(self.handles, self.caps, max_jobs=max_jobs, max_bytes=max_bytes, min_jobs=min_jobs,
                             horizon_s=horizon_s, steal_after_s=steal_after_s, clock=clock)
        self._finished = 0
        self._crash_loop: CrashLoop | None = None  # raised by the next ``check``
        self.suspect_ids = Suspects()  # ids of jobs to run alone when claimed again
        self.cancelling = Cancelling(cancel_grace_s)  # jobs an operator cancelled while held here

    def alive_until(self, boot: float, wall: float) -> None:
        """The heartbeat's word: no peer can have rescued this worker's jobs before these instants."""
        self._alive_until[0], self._alive_until[1] = boot, wall

    @property
    def by_kind(self) -> collections.Counter[str]:
        """Jobs sent and unreported, per capped kind."""
        return self.caps.by_kind

    def __len__(self) -> int:
        return len(self.handles)

    def start(self, fork: bool = False) -> None:  # fork: before the parent connects or starts a thread
        for handle in self.handles:
            handle.start(self.clock(), fork)

    def outstanding(self, index: int) -> int:
        """Jobs routed to child ``index`` and not yet reported (sent, or waiting here)."""
        handle = self.handles[index]
        return len(handle.sent) + len(handle.held)

    def target(self, index: int) -> int:
        """Jobs worth holding for child ``index`` at its recent pace; 0 while it is saturated
        (``shardworker.worker.sending``)."""
        return self.sender.target(self.handles[index], self.clock())

    @property
    def in_flight(self) -> int:
        return sum(len(h.sent) + len(h.held) + len(h.suspects) for h in self.handles)

    def job_ids(self) -> list[int]:
        return [j.id for j in self.held_jobs()]

    def job_keys(self) -> list[wire.JobKey]:
        """(id, attempt) of every job routed to a child and not yet reported."""
        return [(j.id, j.attempt) for j in self.held_jobs()]

    def cancel(self, keys: set[wire.CancelKey]) -> int:
        """Stop the held attempts ``keys`` name (``shardworker.worker.cancelling``); how many not yet stopping."""
        added = self.cancelling.add(matching(self.job_keys(), keys))
        self._drop_cancelled()
        return added

    def _drop_cancelled(self) -> None:
        """Cancelled jobs that wait here, unsent (or taken back from a child): never sent (again).
        The database says cancelled already, and they never started: nothing is left to do."""
        if not self.cancelling:
            return
        for handle in self.handles:
            for waiting in (handle.held, handle.suspects):
                dropped = [j for j in waiting if (j.id, j.attempt) in self.cancelling]
                for job in dropped:
                    waiting.remove(job)
                    log.info("job %d (%s) was cancelled before it started: dropped", job.id, job.kind)

    def held_jobs(self) -> list[ClaimedJob]:
        """Every job routed to a child and not yet reported (sent, held here for one, suspects)."""
        return [j for h in self.handles for j in (*(s.job for s in h.sent.values()), *h.held, *h.suspects)]

    def cap_rooms(self) -> dict[str, int]:
        """For each kind this worker caps (``concurrency=K``), how many more of its jobs it
        may claim: K less those claimed and not yet reported (sent, held here, suspects)."""
        if not self.caps.limits:
            return {}
        claimed = collections.Counter(j.kind for h in self.handles for j in (*h.held, *h.suspects))
        return {kind: limit - claimed[kind] - self.caps.by_kind[kind] for kind, limit in self.caps.limits.items()}

    def run_room(self) -> int:
        """Handlers this worker could start now: each child that is up (not starting, not
        restarting, not running a suspect alone) runs ``at_once``, less the jobs it holds
        or that wait here for it. What a claim may take of a kind or queue limited across
        workers: claimed jobs count as running there, and start as soon as they arrive."""
        return sum(max(0, self.at_once - len(h.sent) - len(h.held) - len(h.suspects))
                   for h in self.handles if h.up)

    @property
    def starting(self) -> bool:
        """Whether some child is still coming up (alive, its app not yet loaded)."""
        return any(h.loading for h in self.handles)

    def held_bytes(self) -> int:
        """Payload bytes claimed and waiting here, not yet sent to a child."""
        return sum(j.size for h in self.handles for j in h.held)

    def send(self, index: int, jobs: list[ClaimedJob]) -> None:
        """Route jobs to their home child ``index``; what it has no room for waits here (for
        it, or for another child with room). A suspect waits for its turn to run alone."""
        handle = self.handles[index]
        if self.suspect_ids:
            handle.suspects.extend(j for j in jobs if j.id in self.suspect_ids)
            jobs = [j for j in jobs if j.id not in self.suspect_ids]
        handle.held.extend(jobs)
        self.sender.pump(handle)

    def collect(self) -> int:
        """Jobs reported finished (their outcomes durable) since the last call; sends what
        children have room for, sharing held jobs and recalling unstarted ones for idle children."""
        self._receive_all()
        for handle in self.handles:
            self.sender.pump(handle)
        self.sender.share()
        self.sender.recall_stuck()
        finished, self._finished = self._finished, 0
        return finished

    def _receive_all(self) -> None:
        now = self.clock()
        for handle in self.handles:
            handle.flush()
            reported = handle.receive()
            if reported:
                handle.reported(len(reported), now)
            self._forget(reported)
            if returned := handle.take_returned():  # recalled jobs, held again: their kinds' caps free up
                self._forget(returned, finished=False)
                self._drop_cancelled()  # a cancelled one taken back is not sent again

    def _forget(self, taken: list[Sent], *, finished: bool = True) -> None:
        """Jobs taken off a child: their kind caps free up; ``finished`` ones count as done."""
        for sent in taken:
            self.caps.taken(sent.job.kind)
        if finished:
            self.suspect_ids.cleared(taken)  # each ran alone to its end: innocent
            self._finished += len(taken)

    def wait_fds(self) -> tuple[list[int], list[int]]:
        """Descriptors to wait on: reports to read, and pipes with frames still to write."""
        ready = [h for h in self.handles if h.alive and h.inp is not None and h.out is not None]
        return [h.inp.fd for h in ready if h.inp], [h.out.fd for h in ready if h.out and h.out.queued_bytes]

    def check(self) -> list[Death]:
        """Settle dead and timed-out children, restart those whose backoff has passed, send
        suspects their turn.

        Raises ``CrashLoop`` when a child died too often right after starting (once the
        deaths that led to it were returned, so their jobs are settled first).
        """
        if self._crash_loop is not None:
            raise self._crash_loop
        deaths, now = [], self.clock()
        if self.cancelling:
            self.cancelling.keep_only({(j.id, j.attempt) for j in self.held_jobs()})
            self.cancelling.tell(self.handles, now)
        for handle in self.handles:
            if not handle.started:
                if handle.due_for_restart(now):
                    handle.start(now)
                    self.sender.send_suspect(handle)
                    self.sender.pump(handle)
                continue
            if handle.alive:
                cancelled = self.cancelling.overdue(handle, now)
                late = self.timeouts.late(handle, now) | cancelled
                if not late:
                    self.sender.send_suspect(handle)
                    continue
                procs.kill_quietly(handle.process.pid)
                deaths.append(self._settle(handle, blame.Cause(killed=True, timed_out=late, cancelled=set(cancelled)),
                                           now))
                continue
            deaths.append(self._settle(handle, blame.Cause(fatal=handle.fatal, exitcode=handle.process.exitcode), now))
            self._crash_loop = handle.start_failed() or self._crash_loop  # read once _settle read its Fatal
        return deaths

    def _settle(self, handle: ChildHandle, cause: blame.Cause, now: float | None = None) -> Death:
        """Judge a dead child's jobs (``shardworker.worker.deaths``), hold what runs again for its
        successor and, with ``now``, schedule the restart: at once after a death a job
        caused, paced by its crash counter otherwise."""
        left = leftovers(handle)
        self._forget(left.reported)
        self._forget(left.taken, finished=False)  # the dispatcher counts the death's own
        # Other handlers that ran in this process (finished, durable or returned) may have left
        # a thread or a timer behind that killed it: then one running job is not the known cause.
        others_ran = handle.finished_here > 0 or left.durable > 0 or bool(left.unsaved)
        alone = len(left.unfinished) == 1 and (left.unfinished[0].id, left.unfinished[0].attempt) == handle.suspect
        verdict = blame.judge(cause, left.unfinished, left.unsaved, others_ran=others_ran, alone=alone)
        unstarted = handle.keep_suspects_turn(left.unstarted)
        self.suspect_ids.add(verdict.suspects)
        handle.held.extendleft(reversed(unstarted))  # first, in their order
        log_death(handle.index, verdict, len(left.unstarted))
        handle.died(restart_at=now)  # None: the worker is stopping
        if now is not None and verdict.crash:
            self._count_crash(handle, now, verdict.reason)
        return Death(handle.index, verdict.reason, left.durable, tuple(j for j, _ in verdict.charged),
                     tuple(left.unstarted), tuple(e for _, e in verdict.charged), verdict.snooze, tuple(left.steps))

    def _count_crash(self, handle: ChildHandle, now: float, reason: str) -> None:
        try:
            handle.died(restart_at=now + handle.crashes.died(now, reason))
        except CrashLoop as exc:
            handle.retire()
            self._crash_loop = exc

    def request_stop(self) -> None:
        for handle in self.handles:
            handle.request_stop()

    def finish(self, deadline: float, on_finished: Callable[[int], None]) -> tuple[list[Death], list[wire.JobKey]]:
        """After ``request_stop``: wait for children to stop (kill them at ``deadline``).

        Reports finished jobs through ``on_finished``; returns the deaths to settle and the
        (id, attempt) of jobs never started (sent and returned, or never sent).
        """
        unstarted: list[wire.JobKey] = []
        deaths: list[Death] = []
        while self.clock() < deadline and any(h.alive and not h.stopped for h in self.handles):
            reads, writes = self.wait_fds()
            procs.wait_ready(reads, writes, 0.1)
            on_finished(self._collect_only())
            deaths += self._stop_overdue_cancels()
        on_finished(self._collect_only())
        for handle in self.handles:
            if handle.stopped:
                unstarted.extend(handle.unstarted)
                handle.process.join(5)
            elif handle.process is not None:
                # Out of time, or it died: settle what it held without restarting it.
                deaths.append(self._settle(handle, shutdown_cause(handle)))
                on_finished(self._finished)
                self._finished = 0
            # What never started (held, suspects waiting their turn) goes back to the queue uncharged.
            unstarted.extend((j.id, j.attempt) for j in (*handle.suspects, *handle.held))
            handle.held.clear()
            handle.suspects.clear()
        return deaths, unstarted

    def _stop_overdue_cancels(self) -> list[Death]:
        """While stopping: a child whose cancelled handler is past its grace is stopped now."""
        deaths = []
        self.cancelling.tell(self.handles, self.clock())  # starts the grace of a cancel not told yet
        for handle in self.handles:
            late = self.cancelling.overdue(handle, self.clock()) if handle.alive and not handle.stopped else {}
            if late:
                procs.kill_quietly(handle.process.pid)
                deaths.append(self._settle(handle, blame.Cause(killed=True, timed_out=late, cancelled=set(late))))
                handle.stopped_without_report()
        return deaths

    def _collect_only(self) -> int:
        """``collect`` without sending more (shutting down)."""
        self._receive_all()
        finished, self._finished = self._finished, 0
        return finished

    def kill_all(self) -> None:
        for handle in self.handles:
            if handle.alive:
                procs.kill_quietly(handle.process.pid)
