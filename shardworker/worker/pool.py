"""The child pool: the parent's side of its child processes.

It starts N children, sends them jobs, collects what they report, notices deaths and
handler timeouts, settles a dead child's jobs and restarts it (with a backoff that never
blocks the caller, and a ``CrashLoop`` verdict for a child that keeps dying at once). It
returns plain results and never touches the database: the dispatcher writes the
failures of lost jobs and counts what was settled.

What a child holds is bounded: at most its ``target`` of jobs and about ``max_bytes`` of
payload sent and not yet reported (one job over the byte budget goes alone), and, across
the pool, at most ``concurrency=K`` jobs of a kind that caps it. The target follows the
child's pace: ``min_jobs``, plus what it finishes in ``horizon_s`` at its recent rate, up
to ``max_jobs``; a child stuck on a slow handler soon holds no more than ``min_jobs``.
Sends never block: frames queue on a non-blocking pipe and go out as the child reads.

Routing: the hash, ``shard_for(id, N)``, picks a job's home child, and a saturated
child's jobs run elsewhere. Jobs beyond what their home child can take wait here, in its
``held`` queue, and a child with room takes, after its own, the held jobs of the others.
A child with a job sent ``steal_after_s`` ago and not started, while another child is
idle or behind its running handlers while it finished nothing for as long (they are all
busy), is
``recall``ed: its main thread, which always reads the pipe, takes its unstarted jobs off
its lanes and names them (``Returned``; one that started meanwhile is simply not
returned), and they wait here again for a child with room. It is then *saturated*
(target 0: sent nothing, claimed for by no one) until it reports a job finished after
that, or has nothing left to run. The fast path pays no syscall and no scan per job.

Each sent job gets a progress slot; the child marks it when the handler starts and when
it finishes. After a death, a started job whose outcome is durable in the child's shard
counts as finished, the unstarted ones wait here again, and ``shardworker.worker.blame`` judges
the started ones without an outcome: the job that caused the death is charged, the others
are snoozed (a new attempt, none used up); when the cause is unknown they become
*suspects*, which this worker runs one at a time, alone, when it claims them again. A
death a job caused restarts the child at once; only one with no job running, or a
``Fatal`` report, counts toward the crash-loop verdict.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from shardworker import logs, procs, wire
from shardworker.app import HandlerSpec
from shardworker.config import ChildConfig
from shardworker.errors import CrashLoop
from shardworker.jobstats import JobCounts
from shardworker.model import ClaimedJob
from shardworker.worker import blame
from shardworker.worker.child_handle import ASYNC_TIMEOUT_GRACE_S, ChildHandle, Death, Sent

log = logging.getLogger(__name__)

MAX_SUSPECTS = 10_000  # ids remembered to run alone; each a few dozen bytes


class ChildPool:
    """The children of one worker."""

    def __init__(self, configs: Iterable[ChildConfig], specs: Mapping[str, HandlerSpec], *, max_jobs: int,
                 max_bytes: int, min_jobs: int | None = None, horizon_s: float = 0.0,
                 steal_after_s: float = 0.5, clock: Callable[[], float] = time.monotonic) -> None:
        self.job_counts = JobCounts()  # finished jobs by kind and outcome, as the children report them
        self.handles = [ChildHandle(config, job_counts=self.job_counts) for config in configs]
        self.specs, self.max_jobs, self.max_bytes, self.clock = specs, max_jobs, max_bytes, clock
        self.min_jobs, self.horizon_s = min(max_jobs, min_jobs or max_jobs), horizon_s
        self.steal_after_s = steal_after_s
        self._next_recall_check = 0.0
        self.limits = {kind: spec.concurrency for kind, spec in specs.items() if spec.concurrency}
        self.by_kind: collections.Counter[str] = collections.Counter()  # sent and unreported, per capped kind
        self._finished = 0
        self._crash_loop: CrashLoop | None = None  # raised by the next ``check``
        # Ids of jobs snoozed after a death whose cause is unknown: when claimed again, each
        # runs alone, so a second death names it. Bounded: the oldest are forgotten first.
        self.suspect_ids: dict[int, None] = {}

    def __len__(self) -> int:
        return len(self.handles)

    def start(self) -> None:
        for handle in self.handles:
            handle.start(self.clock())

    def outstanding(self, index: int) -> int:
        """Jobs routed to child ``index`` and not yet reported (sent, or waiting here)."""
        handle = self.handles[index]
        return len(handle.sent) + len(handle.held)

    def target(self, index: int) -> int:
        """Jobs worth holding for child ``index`` at its recent pace; 0 while it is saturated
        (see the module docstring)."""
        return self._target(self.handles[index], self.clock())

    def _target(self, handle: ChildHandle, now: float) -> int:
        if handle.saturated:
            return 0
        return min(self.max_jobs, self.min_jobs + int(handle.pace.roll(now) * self.horizon_s))

    @property
    def in_flight(self) -> int:
        return sum(len(h.sent) + len(h.held) + len(h.suspects) for h in self.handles)

    def job_ids(self) -> list[int]:
        """Ids of every job routed to a child and not yet reported."""
        return ([s.job.id for h in self.handles for s in h.sent.values()] + [j.id for h in self.handles for j in h.held]
                + [j.id for h in self.handles for j in h.suspects])

    def held_bytes(self) -> int:
        """Payload bytes claimed and waiting here, not yet sent to a child."""
        return sum(len(j.payload_json) for h in self.handles for j in h.held)

    def send(self, index: int, jobs: list[ClaimedJob]) -> None:
        """Route jobs to their home child ``index``; what it has no room for waits here (for
        it, or for another child with room). A suspect waits for its turn to run alone."""
        handle = self.handles[index]
        if self.suspect_ids:
            handle.suspects.extend(j for j in jobs if j.id in self.suspect_ids)
            jobs = [j for j in jobs if j.id not in self.suspect_ids]
        handle.held.extend(jobs)
        self._pump(handle)

    def _pump(self, handle: ChildHandle, held: collections.deque[ClaimedJob] | None = None) -> int:
        """Send jobs from ``held`` (the child's own by default) while the child has room and
        their kinds are under their caps; returns how many more it could take (0: full, or
        nothing to send)."""
        held = handle.held if held is None else held
        if not held or handle.recalling:
            return 0
        now = self.clock()
        jobs_left = min(self._target(handle, now) - len(handle.sent), handle.free_slots)
        if jobs_left <= 0 or not handle.ready:  # ready (a waitpid) last: this runs every pass
            return 0
        batch: list[ClaimedJob] = []
        sizes: list[int] = []
        skipped: list[ClaimedJob] = []
        bytes_left = self.max_bytes - handle.sent_bytes
        while held and len(batch) < jobs_left:
            job = held[0]
            limit = self.limits.get(job.kind)
            if limit is not None and self.by_kind[job.kind] >= limit:
                skipped.append(held.popleft())  # its kind is at its cap: later jobs may go first
                continue
            size = len(job.payload_json) + 64
            if size > bytes_left and (handle.sent or batch):
                jobs_left = len(batch)  # over the byte budget; a job bigger than the budget goes alone
                break
            batch.append(held.popleft())
            sizes.append(size)
            bytes_left -= size
            if limit is not None:
                self.by_kind[job.kind] += 1
        held.extendleft(reversed(skipped))
        if batch:
            handle.send_now(batch, sizes, now)
        return max(0, jobs_left - len(batch))

    def collect(self) -> int:
        """Jobs reported finished (their outcomes durable) since the last call; sends what
        children have room for, sharing held jobs and recalling unstarted ones for idle children."""
        self._receive_all()
        for handle in self.handles:
            self._pump(handle)
        self._share()
        self._recall_stuck()
        finished, self._finished = self._finished, 0
        return finished

    def _share(self) -> None:
        """Children with room take the jobs held for children that have none."""
        donors = [h for h in self.handles if h.held]
        if not donors:
            return
        for handle in self.handles:
            for donor in donors:
                if donor is not handle and donor.held and self._pump(handle, donor.held) == 0:
                    break

    def _recall_stuck(self) -> None:
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

    def _receive_all(self) -> None:
        now = self.clock()
        for handle in self.handles:
            handle.flush()
            reported = handle.receive()
            if reported:
                handle.pace.finished(len(reported), now)
                handle.reported_at = now
            self._forget(reported)
            if handle.returned:  # recalled jobs, held again: their kinds' caps free up
                self._forget(handle.returned, finished=False)
                handle.returned = []

    def _forget(self, taken: list[Sent], *, finished: bool = True) -> None:
        """Jobs taken off a child: their kind caps free up; ``finished`` ones count as done."""
        for sent in taken:
            if sent.job.kind in self.limits:
                self.by_kind[sent.job.kind] -= 1
        if finished and self.suspect_ids:
            for sent in taken:
                self.suspect_ids.pop(sent.job.id, None)  # it ran alone to its end: innocent
        if finished:
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
        for handle in self.handles:
            if handle.restart_at is not None:
                if now >= handle.restart_at:
                    handle.start(now)
                    self._send_suspect(handle)
                    self._pump(handle)
                continue
            if handle.alive:
                timed_out = self._timed_out(handle, now)
                if not timed_out:
                    self._send_suspect(handle)
                    continue
                procs.kill_quietly(handle.process.pid)
                deaths.append(self._settle(handle, blame.Cause(killed=True, timed_out=timed_out), now))
                continue
            deaths.append(self._settle(handle, blame.Cause(fatal=handle.fatal, exitcode=handle.process.exitcode),
                                       now))
        return deaths

    def _settle(self, handle: ChildHandle, cause: blame.Cause, now: float | None = None) -> Death:
        """Judge a dead child's jobs (``shardworker.worker.blame``), hold what runs again for its
        successor and, with ``now``, schedule the restart: at once after a death a job
        caused, paced by its crash counter otherwise."""
        left = handle.settle()
        self._forget(left.reported)
        self._forget(left.taken, finished=False)  # the dispatcher counts the death's own
        verdict = blame.judge(cause, left.unfinished, left.unsaved)
        unstarted = left.unstarted
        if handle.suspect is not None:  # a suspect it never started keeps its turn
            back = [j for j in unstarted if (j.id, j.attempt) == handle.suspect]
            unstarted = [j for j in unstarted if (j.id, j.attempt) != handle.suspect]
            handle.suspects.extendleft(back)
            handle.suspect = None
        self._suspect(verdict.suspects)
        handle.held.extendleft(reversed(unstarted))  # first, in their order
        self._log_death(handle, verdict, len(left.unstarted))
        if now is not None:
            handle.restart_at = now
            if verdict.crash:
                self._count_crash(handle, now, verdict.reason)
        return Death(handle.index, verdict.reason, left.durable, tuple(j for j, _ in verdict.charged),
                     tuple(left.unstarted), tuple(e for _, e in verdict.charged), verdict.snooze)

    def _count_crash(self, handle: ChildHandle, now: float, reason: str) -> None:
        try:
            handle.restart_at = now + handle.crashes.died(now, reason)
        except CrashLoop as exc:
            handle.restart_at = float("inf")
            self._crash_loop = exc

    @staticmethod
    def _log_death(handle: ChildHandle, verdict: blame.Verdict, unstarted: int) -> None:
        if verdict.charged or verdict.snooze:
            log.error("child %d: %s; %d jobs charged a failed attempt (%s), %d queued again uncharged (of them %d "
                      "suspects, to run alone), %d not started", handle.index, verdict.reason,
                      len(verdict.charged), ", ".join(str(j.id) for j, _ in verdict.charged) or "none",
                      len(verdict.snooze), len(verdict.suspects), unstarted)

    def _suspect(self, jobs: Iterable[ClaimedJob]) -> None:
        for job in jobs:
            self.suspect_ids[job.id] = None
        while len(self.suspect_ids) > MAX_SUSPECTS:
            del self.suspect_ids[next(iter(self.suspect_ids))]

    def _send_suspect(self, handle: ChildHandle) -> None:
        """Send the next suspect when the child holds nothing else (and its kind is under its cap)."""
        if not handle.suspects or handle.sent or handle.restart_at is not None or not handle.alive:
            return
        job = handle.suspects[0]
        limit = self.limits.get(job.kind)
        if limit is not None and self.by_kind[job.kind] >= limit:
            return
        handle.suspects.popleft()
        if limit is not None:
            self.by_kind[job.kind] += 1
        handle.suspect = (job.id, job.attempt)
        handle.send_now([job], [len(job.payload_json) + 64])

    def _timed_out(self, handle: ChildHandle, now: float) -> dict[wire.JobKey, str]:
        """The running jobs past their timeout (async ones past it and the grace), with their error."""
        late = {}
        for job, started in handle.running():
            spec = self.specs.get(job.kind)
            if spec is None or spec.timeout_s is None:
                continue
            allowed = spec.timeout_s + (ASYNC_TIMEOUT_GRACE_S if spec.is_async else 0.0)
            if now - started > allowed:
                log.error("job %d (%s) exceeded its %gs timeout; killing child %d", job.id, job.kind,
                          spec.timeout_s, handle.index, extra=logs.job_fields(job))
                late[(job.id, job.attempt)] = f"timed out after {spec.timeout_s:g}s"
        return late

    def request_stop(self) -> None:
        for handle in self.handles:
            handle.request_stop()

    def finish(self, deadline: float, on_finished: Callable[[int], None]) -> tuple[list[Death], list[wire.JobKey]]:
        """After ``request_stop``: wait for children to stop (kill them at ``deadline``).

        Reports finished jobs through ``on_finished``; returns the deaths to settle and the
        (id, attempt) of jobs never started (sent and returned, or never sent).
        """
        unstarted: list[wire.JobKey] = []
        while self.clock() < deadline and any(h.alive and not h.stopped for h in self.handles):
            reads, writes = self.wait_fds()
            procs.wait_ready(reads, writes, 0.1)
            on_finished(self._collect_only())
        on_finished(self._collect_only())
        deaths: list[Death] = []
        for handle in self.handles:
            if handle.stopped:
                unstarted.extend(handle.unstarted)
                handle.process.join(5)
            elif handle.process is not None:
                # Out of time, or it died: settle what it held without restarting it.
                deaths.append(self._settle(handle, self._shutdown_cause(handle)))
                on_finished(self._finished)
                self._finished = 0
            # What never started (held, suspects waiting their turn) goes back to the queue uncharged.
            unstarted.extend((j.id, j.attempt) for j in (*handle.suspects, *handle.held))
            handle.held.clear()
            handle.suspects.clear()
        return deaths, unstarted

    @staticmethod
    def _shutdown_cause(handle: ChildHandle) -> blame.Cause:
        """Why a child did not stop in time: it died (judged as any death), or it is killed now
        and its running jobs are charged, as a timeout."""
        if not handle.alive:
            return blame.Cause(fatal=handle.fatal, exitcode=handle.process.exitcode)
        procs.kill_quietly(handle.process.pid)
        handle.process.join(5)
        running = handle.running()
        return blame.Cause(killed=True, timed_out={(job.id, job.attempt): "shutdown timeout" for job, _ in running})

    def _collect_only(self) -> int:
        """``collect`` without sending more (shutting down)."""
        self._receive_all()
        finished, self._finished = self._finished, 0
        return finished

    def kill_all(self) -> None:
        for handle in self.handles:
            if handle.alive:
                procs.kill_quietly(handle.process.pid)
