"""Who is charged when a child process ends: the job that caused it, never its neighbours.

A dead child leaves started jobs without a durable outcome: *unfinished* ones (their
handler was still running) and *unsaved* ones (their handler returned, the outcome was not
yet fsync'd). ``judge`` decides, from why the child ended, which of them get a failed
attempt and which run again uncharged. An innocent unfinished job runs again under the
same (id, attempt) (its row is still ``running`` at that attempt under this worker, so the
fence holds; unfinished work is at-least-once). An unsaved one is *snoozed* instead (an
outcome that queues it again at once and uses no attempt): its handler did return for that
attempt, and a handler never runs twice for one (id, attempt) it finished.

* killed for a timeout: the jobs past their timeout are charged ("timed out after 5s");
  every other unfinished one is resent;
* the child reported ``Fatal`` (its outbox cannot take outcomes): every one is charged with
  that error, as before, and the death counts toward the crash-loop detector;
* it died by itself with one unfinished job: that job is charged ("the handler's process
  died: signal 11 (SIGSEGV)"); with several, nobody is known to be the cause: they are all
  *suspects*, resent to run one at a time, alone, so the next death names the culprit;
  with none (it died starting, or between jobs), the death counts toward the crash-loop
  detector. Unsaved jobs are snoozed in every case but ``Fatal``.

Pure logic on plain values: the pool (``shardworker.children``) applies the verdict.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shardworker.model import ClaimedJob
from shardworker.wire import JobKey


@dataclass(frozen=True)
class Cause:
    """Why a child ended: ``killed`` by the parent for these timed-out jobs (key -> error), a
    ``Fatal`` report, or by itself with ``exitcode`` (negative: the signal that killed it)."""

    killed: bool = False
    timed_out: Mapping[JobKey, str] = field(default_factory=dict)
    fatal: str = ""
    exitcode: int | None = None


@dataclass(frozen=True)
class Verdict:
    """What to do with a dead child's started jobs that have no durable outcome."""

    reason: str  # the death in a few words, for the log and the crash-loop verdict
    charged: tuple[tuple[ClaimedJob, str], ...] = ()  # (job, error): a failed attempt each
    resend: tuple[ClaimedJob, ...] = ()  # run again under the same attempt, like unstarted jobs
    snooze: tuple[ClaimedJob, ...] = ()  # queued again at once by a snooze outcome (no attempt used)
    suspects: tuple[ClaimedJob, ...] = ()  # run again under the same attempt, one at a time, alone
    crash: bool = False  # counts toward the crash-loop detector


def judge(cause: Cause, unfinished: Sequence[ClaimedJob], unsaved: Sequence[ClaimedJob]) -> Verdict:
    """The verdict on a dead child's ``unfinished`` and ``unsaved`` jobs (see the module docstring)."""
    if cause.killed:
        charged = tuple((j, cause.timed_out[(j.id, j.attempt)]) for j in unfinished
                        if (j.id, j.attempt) in cause.timed_out)
        innocent = tuple(j for j in unfinished if (j.id, j.attempt) not in cause.timed_out)
        return Verdict("killed for a timeout", charged, innocent, tuple(unsaved))
    if cause.fatal:
        return Verdict(cause.fatal, tuple((j, cause.fatal) for j in (*unfinished, *unsaved)), crash=True)
    died = process_death(cause.exitcode)
    if len(unfinished) == 1:
        return Verdict(f"worker process died ({died})", ((unfinished[0], f"the handler's process died: {died}"),),
                       snooze=tuple(unsaved))
    if unfinished:
        return Verdict(f"worker process died ({died})", snooze=tuple(unsaved), suspects=tuple(unfinished))
    return Verdict(f"worker process died ({died})", snooze=tuple(unsaved), crash=True)


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
