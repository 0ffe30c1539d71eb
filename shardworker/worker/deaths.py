"""What a child's death leaves, and how the pool judges and logs it.

Each sent job gets a progress slot; the child marks it when the handler starts and when
it finishes. After a death, ``leftovers`` sorts what the child held: a started job whose
outcome is durable in the child's shard counts as finished, the unstarted ones wait in
the pool again, the step records of the started ones without an outcome are carried over
to the parent's shard ahead of the outcome it writes for them (so they land in PostgreSQL
first, wherever the job runs next), and ``shardworker.worker.blame`` judges the started ones without an
outcome: the job that caused the death is charged, the others are snoozed (a new attempt,
none used up); when the cause is unknown they become ``Suspects``, which this worker runs
one at a time, alone, when it claims them again. A child is also killed, and its death
judged the same way, when a handler outlives its timeout (``timed_out``) or the child does
not stop in time at shutdown (``shutdown_cause``). The pool (``shardworker.worker.pool``)
applies the verdict and restarts the child.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import outbox
from shardworker.app import HandlerSpec
from shardworker.core import logs, procs, wire
from shardworker.core.model import ClaimedJob
from shardworker.worker import blame
from shardworker.worker.child_handle import ASYNC_TIMEOUT_GRACE_S, ChildHandle, Sent

log = logging.getLogger(__name__)

MAX_SUSPECTS = 10_000  # ids remembered to run alone; each a few dozen bytes
CLOCK_SLACK_S = 300.0  # how much older than a dead child's first started job a segment it read may be


@dataclass(frozen=True)
class Death:
    """What a dead child left: how many started jobs have a durable outcome, the started
    jobs charged a failed attempt (``errors`` holds each one's error; when empty, ``reason``
    is every one's), the jobs it never started (resent once it is restarted) and those to
    snooze (their handler returned, the outcome was lost with the child)."""

    index: int
    reason: str
    durable: int
    lost: tuple[ClaimedJob, ...]
    unstarted: tuple[ClaimedJob, ...]
    errors: tuple[str, ...] = ()
    snoozed: tuple[ClaimedJob, ...] = ()
    steps: tuple[bytes, ...] = ()  # step records of the charged and snoozed jobs, carried over first

    def charges(self) -> dict[str, list[ClaimedJob]]:
        """The charged jobs by their error."""
        by_error: dict[str, list[ClaimedJob]] = {}
        for job, error in zip(self.lost, self.errors or (self.reason,) * len(self.lost), strict=True):
            by_error.setdefault(error, []).append(job)
        return by_error


@dataclass(frozen=True)
class Leftovers:
    """A dead child's unreported jobs, split by what its progress slots and shard tell."""

    reported: list[Sent]  # reported finished before it died (read at last)
    taken: list[Sent]  # every other job sent to it, now taken off it
    durable: int  # started jobs whose outcome is durable in its shard
    unfinished: list[ClaimedJob]  # started, handler still running, no durable outcome
    unsaved: list[ClaimedJob]  # handler returned, outcome not durable
    unstarted: list[ClaimedJob]
    steps: list[bytes]  # the step records of the unfinished and unsaved jobs' attempts


def leftovers(handle: ChildHandle) -> Leftovers:
    """After the process died: split its unreported jobs by what its shard holds, and take
    them all off it (the pool decides who is charged and what is resent)."""
    reported = handle.receive()
    handle.process.join(1)
    progress = handle.progress
    sent = handle.take_all()
    started = [s for s in sent if progress is not None and progress.started(s.slot, s.job.id)]
    durable: set[wire.JobKey] = set()
    steps_by_key: list[tuple[wire.JobKey, bytes]] = []
    if started and progress is not None:
        first = min(progress.began_at(s.slot) for s in started)
        since = time.time() - (time.monotonic() - first) - CLOCK_SLACK_S
        durable, steps_by_key = written_since(handle.config.outbox_dir, handle.index, since)
    left = [s for s in started if (s.job.id, s.job.attempt) not in durable]
    running = [progress is not None and progress.running_since(s.slot, s.job.id) is not None for s in left]
    unfinished = [s.job for s, r in zip(left, running, strict=True) if r]
    unsaved = [s.job for s, r in zip(left, running, strict=True) if not r]
    unstarted = [s.job for s in sent if s not in started]
    lost = {(s.job.id, s.job.attempt) for s in left}
    steps = [record for key, record in steps_by_key if key in lost]
    return Leftovers(reported, sent, len(started) - len(left), unfinished, unsaved, unstarted, steps)


def written_since(directory: str, shard: int, since: float) -> tuple[set[wire.JobKey], list[tuple[wire.JobKey, bytes]]]:
    """What a dead child wrote to its shard since ``since`` (Unix s): the keys of its durable
    outcomes, and its step records as they are, with their keys (headers read, nothing decoded)."""
    outcomes: set[wire.JobKey] = set()
    steps: list[tuple[wire.JobKey, bytes]] = []
    for payload in outbox.records_since(directory, shard, since):
        if (key := wire.step_key(payload)) is not None:
            steps.append((key, payload))
            continue
        with contextlib.suppress(ValueError, TypeError):
            outcomes.add(wire.outcome_key(payload))
    return outcomes, steps


class Timeouts:
    """The running jobs past their timeout (async ones past it and the grace), looked for in a
    child only once its earliest deadline may have passed: the dispatcher asks at every turn,
    and every handler has a timeout (``--default-timeout``)."""

    def __init__(self, specs: Mapping[str, HandlerSpec]) -> None:
        self.specs = specs
        self.allowed = {kind: spec.timeout_s + (ASYNC_TIMEOUT_GRACE_S if spec.is_async else 0.0)
                        for kind, spec in specs.items() if spec.timeout_s is not None}
        self.shortest = min(self.allowed.values(), default=float("inf"))
        self._next_at: dict[int, float] = {}  # by child index: no deadline passes before it

    def late(self, handle: ChildHandle, now: float) -> dict[wire.JobKey, str]:
        """The late jobs of ``handle``, with their error (none before its next deadline)."""
        late: dict[wire.JobKey, str] = {}
        if now < self._next_at.get(handle.index, 0.0):
            return late
        next_at = now + self.shortest  # a job started from now on
        for job, started in handle.running(self.allowed):
            deadline = started + self.allowed[job.kind]
            if now <= deadline:
                next_at = min(next_at, deadline)
                continue
            timeout_s = self.specs[job.kind].timeout_s
            grace = (f" and did not stop within {ASYNC_TIMEOUT_GRACE_S:g}s more (its event loop blocked?)"
                     if self.specs[job.kind].is_async else "")
            log.error("job %d (%s) exceeded its %gs timeout%s; killing child %d", job.id, job.kind, timeout_s,
                      grace, handle.index, extra=logs.job_fields(job))
            late[(job.id, job.attempt)] = f"timed out after {timeout_s:g}s"
        self._next_at[handle.index] = next_at
        return late


def shutdown_cause(handle: ChildHandle) -> blame.Cause:
    """Why a child did not stop in time: it died (judged as any death), or it is killed now
    and its running jobs are charged, as a timeout."""
    if not handle.alive:
        return blame.Cause(fatal=handle.fatal, exitcode=handle.process.exitcode)
    procs.kill_quietly(handle.process.pid)
    handle.process.join(5)
    running = handle.running()
    return blame.Cause(killed=True, timed_out={(job.id, job.attempt): blame.SHUTDOWN_TIMEOUT for job, _ in running})


def log_death(index: int, verdict: blame.Verdict, unstarted: int) -> None:
    if verdict.cancelled:  # its jobs stay cancelled: nothing charged
        log.warning("child %d: %s (jobs %s); %d queued again uncharged, %d not started", index, verdict.reason,
                    ", ".join(str(j.id) for j, _ in verdict.charged), len(verdict.snooze), unstarted)
    elif verdict.charged or verdict.snooze:
        log.error("child %d: %s; %d jobs charged a failed attempt (%s), %d queued again uncharged (of them %d "
                  "suspects, to run alone), %d not started", index, verdict.reason,
                  len(verdict.charged), ", ".join(str(j.id) for j, _ in verdict.charged) or "none",
                  len(verdict.snooze), len(verdict.suspects), unstarted)


class Suspects:
    """Ids of jobs snoozed after a death whose cause is unknown: when claimed again, each
    runs alone, so a second death names it. Bounded: the oldest are forgotten first."""

    def __init__(self, limit: int = MAX_SUSPECTS) -> None:
        self.ids: dict[int, None] = {}
        self.limit = limit

    def __bool__(self) -> bool:
        return bool(self.ids)

    def __contains__(self, job_id: int) -> bool:
        return job_id in self.ids

    def add(self, jobs: Iterable[ClaimedJob]) -> None:
        for job in jobs:
            self.ids[job.id] = None
        while len(self.ids) > self.limit:
            del self.ids[next(iter(self.ids))]

    def cleared(self, finished: Iterable[Sent]) -> None:
        """Jobs that ran to their end: innocent."""
        for sent in finished:
            self.ids.pop(sent.job.id, None)
