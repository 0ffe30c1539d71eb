"""Who is charged when a child process ends: the job that caused it, never its neighbours.

A dead child leaves started jobs without a durable outcome: *unfinished* ones (their
handler was still running) and *unsaved* ones (their handler returned, the outcome was not
yet fsync'd). ``judge`` decides, from why the child ended, which of them get a failed
attempt and which run again uncharged. A job that runs again uncharged is *snoozed*: the
parent writes an outcome that queues it again at once and uses no attempt (its ``snoozes``
grows by one, as a handler's ``Snooze`` makes it), so its next run is a new attempt with
every attempt it had left. Never the same attempt again: a handler runs at
most once per (id, attempt), which the outbox's checks and the promise rely on.

* killed for a timeout: the jobs past their timeout are charged ("timed out after 5s");
  every other one is snoozed;
* the child reported ``Fatal`` (its outbox cannot take outcomes): every one is charged with
  that error, as before, and the death counts toward the crash-loop detector;
* it died by itself with one unfinished job that was the only handler this process ran, or
  that ran alone as a suspect: that job is charged ("the handler's process died: signal 11
  (SIGSEGV)"); with several, or one after other handlers ran in the process (one of those may
  have left a thread or a timer that killed it after it returned), nobody is known to be the
  cause: they are all snoozed and become *suspects*, which this worker runs one at a time,
  alone, in a fresh process, when it claims them again, so the next death names the culprit;
  with none (it died starting, or between jobs), the death counts toward the crash-loop
  detector. Unsaved jobs are snoozed in every case but ``Fatal``.

Pure logic on plain values: the pool (``shardworker.worker.pool``) applies the verdict.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from shardworker.core.model import ClaimedJob
from shardworker.core.wire import JobKey

SHUTDOWN_TIMEOUT = "shutdown timeout"  # the error of a job still running when a stop's time ran out


@dataclass(frozen=True)
class Cause:
    """Why a child ended: ``killed`` by the parent for these timed-out jobs (key -> error), a
    ``Fatal`` report, or by itself with ``exitcode`` (negative: the signal that killed it)."""

    killed: bool = False
    timed_out: Mapping[JobKey, str] = field(default_factory=dict)
    cancelled: AbstractSet[JobKey] = frozenset()  # of timed_out: an operator cancelled them (past the grace)
    fatal: str = ""
    exitcode: int | None = None


@dataclass(frozen=True)
class Verdict:
    """What to do with a dead child's started jobs that have no durable outcome."""

    reason: str  # the death in a few words, for the log and the crash-loop verdict
    charged: tuple[tuple[ClaimedJob, str], ...] = ()  # (job, error): a failed attempt each
    snooze: tuple[ClaimedJob, ...] = ()  # queued again at once by a snooze outcome (no attempt used)
    suspects: tuple[ClaimedJob, ...] = ()  # among ``snooze``: run alone when claimed again
    crash: bool = False  # counts toward the crash-loop detector
    cancelled: bool = False  # killed only for cancelled jobs: nothing is really charged (they stay cancelled)


def judge(cause: Cause, unfinished: Sequence[ClaimedJob], unsaved: Sequence[ClaimedJob], *,
          others_ran: bool = False, alone: bool = False) -> Verdict:
    """The verdict on a dead child's ``unfinished`` and ``unsaved`` jobs (see the module
    docstring): ``others_ran``, whether other handlers ran in that process before (one of them
    may be the cause); ``alone``, whether the one unfinished job ran alone as a suspect."""
    if cause.killed:
        charged = tuple((j, cause.timed_out[(j.id, j.attempt)]) for j in unfinished
                        if (j.id, j.attempt) in cause.timed_out)
        innocent = tuple(j for j in unfinished if (j.id, j.attempt) not in cause.timed_out)
        cancelled = bool(charged) and all((j.id, j.attempt) in cause.cancelled for j, _ in charged)
        at_shutdown = bool(charged) and all(error == SHUTDOWN_TIMEOUT for _, error in charged)
        why = ("killed: a cancelled handler did not stop in time" if cancelled
               else "killed: still running at the end of --shutdown-timeout" if at_shutdown
               else "killed for a timeout")
        return Verdict(why, charged, (*innocent, *unsaved), cancelled=cancelled)
    if cause.fatal:
        return Verdict(cause.fatal, tuple((j, cause.fatal) for j in (*unfinished, *unsaved)), crash=True)
    died = process_death(cause.exitcode)
    if len(unfinished) == 1 and (alone or not others_ran):
        return Verdict(f"worker process died: {died}", ((unfinished[0], f"the handler's process died: {died}"),),
                       snooze=tuple(unsaved))
    if unfinished:
        return Verdict(f"worker process died: {died}", snooze=(*unfinished, *unsaved), suspects=tuple(unfinished))
    return Verdict(f"worker process died: {died}", snooze=tuple(unsaved), crash=True)


def process_death(exitcode: int | None) -> str:
    """``signal 11 (SIGSEGV)`` or ``exit code 1``: how a process ended, from its exit code."""
    if exitcode is None:
        return "unknown exit status"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
        return f"signal {-exitcode} ({name})"
    return f"exit code {exitcode}"
