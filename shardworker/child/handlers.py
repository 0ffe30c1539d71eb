"""Running one handler, sync or ``async def``, and turning whatever happens into an Outcome.

Whatever a handler does, the outcome is storable: an exception message with a lone
surrogate or a NUL byte is escaped, a ``retry_delay`` that raises or returns NaN falls back
to the default backoff, one that returns infinity means "do not retry", a result
PostgreSQL's jsonb cannot hold (``\\u0000``) or orjson cannot encode fails the job for good
with the reason. The exceptions of ``shardworker.control`` steer the job instead
(``controlled``). Only ``BaseException``s that are not ``Exception`` (a KeyboardInterrupt,
SystemExit) escape, and end the child. An ``Attempt`` (``attempt_sync``, ``attempt_async``)
also carries the exception that failed it, for ``app.on_failure``; a failed attempt's
outcome carries its traceback, bounded (``bounded_traceback``), and when it failed.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from dataclasses import replace
from typing import NamedTuple

from shardworker.app import App, HandlerSpec
from shardworker.child.cancels import OPERATOR_CANCEL, Flag
from shardworker.child.followups import FollowUps
from shardworker.child.results import Unstorable, storable_json
from shardworker.child.steps import AsyncSteps, StepLog, SyncSteps
from shardworker.child.waits import Waits
from shardworker.control import Cancel, Fail, JobControl, Retry, Snooze
from shardworker.core import tracing
from shardworker.core.limits import MAX_JOB_INPUT_BYTES, MAX_PAYLOAD_BYTES, MAX_TRACEBACK_BYTES
from shardworker.core.model import ClaimedJob, Disposition, Outcome
from shardworker.errors import EventTimeout

FAILURES = (Disposition.RETRY, Disposition.FAILED)  # the outcomes of a failed attempt


class Attempt(NamedTuple):
    """One run's outcome and, when it is a failure, the exception that failed it (for
    ``app.on_failure``): the handler's own, the ``Fail`` or ``Retry`` it raised, the
    ``Unstorable`` of its result, or a ``Fail`` for a run refused before it started."""

    outcome: Outcome
    error: BaseException | None = None


def run_sync(app: App, job: ClaimedJob, steps: StepLog | None = None,
             cancel: Flag | None = None) -> Outcome:
    """The outcome of ``attempt_sync``."""
    return attempt_sync(app, job, steps, cancel).outcome


async def run_async(app: App, job: ClaimedJob, steps: StepLog | None = None,
                    cancel: Flag | None = None) -> Outcome:
    """The outcome of ``attempt_async``."""
    return (await attempt_async(app, job, steps, cancel)).outcome


def attempt_sync(app: App, job: ClaimedJob, steps: StepLog | None = None,
                 cancel: Flag | None = None) -> Attempt:
    """Run a sync handler to its end (timeouts of sync handlers, and cancels it does not
    heed, are the parent's to enforce); ``steps`` runs its ``job.step`` calls, ``cancel``
    is its ``job.cancelled`` (already set: the handler is not called). When the application
    traces, the run is a span (``shardworker.core.tracing``)."""
    run = tracing.Run.start(job)
    if run is None:
        return _attempt_sync(app, job, steps, cancel)
    try:
        with run.current():
            attempt = _attempt_sync(app, job, steps, cancel)
    except BaseException as exc:  # a SystemExit, a KeyboardInterrupt: the span ends all the same
        run.interrupted(exc)
        raise
    return attempt._replace(outcome=run.end(job, attempt.outcome, attempt.error))


def _attempt_sync(app: App, job: ClaimedJob, steps: StepLog | None, cancel: Flag | None) -> Attempt:
    spec = app.handlers.get(job.kind)
    if spec is None:
        return refused(job, f"no handler for kind {job.kind!r}")
    not_run = input_refused(job) or cancelled_before(job, cancel)
    if not_run is not None:
        return not_run
    followups = FollowUps()
    waits = None
    if steps is not None:
        steps.cancel = cancel
        waits = Waits(steps, steps.note)
    try:
        result = spec.fn(job.to_job(None if steps is None else SyncSteps(steps), followups, cancel, waits))
    except Exception as exc:
        return ended(spec, job, steps, exc, waits=waits)
    except BaseException:
        if suspended(waits):  # the Suspend of a wait, maybe inside a BaseExceptionGroup
            return ended(spec, job, steps, waits=waits)
        raise
    finally:
        if waits is not None:
            waits.flush()
    return ended(spec, job, steps, result=result, followups=followups, waits=waits)


async def attempt_async(app: App, job: ClaimedJob, steps: StepLog | None = None,
                        cancel: Flag | None = None) -> Attempt:
    """Await an ``async def`` handler; past its ``timeout_s`` it is cancelled and the attempt
    fails. An operator's cancel (``cancel`` set, then the task cancelled by its lane) ends
    it as cancelled. When the application traces, the run is a span."""
    run = tracing.Run.start(job)
    if run is None:
        return await _attempt_async(app, job, steps, cancel)
    try:
        with run.current():
            attempt = await _attempt_async(app, job, steps, cancel)
    except BaseException as exc:  # the loop going away (CancelledError), a SystemExit
        run.interrupted(exc)
        raise
    return attempt._replace(outcome=run.end(job, attempt.outcome, attempt.error))


async def _attempt_async(app: App, job: ClaimedJob, steps: StepLog | None, cancel: Flag | None) -> Attempt:
    spec = app.handlers.get(job.kind)
    if spec is None:
        return refused(job, f"no handler for kind {job.kind!r}")
    not_run = input_refused(job) or cancelled_before(job, cancel)
    if not_run is not None:
        return not_run
    deadline = asyncio.timeout(spec.timeout_s)
    followups = FollowUps()
    waits = None
    if steps is not None:
        steps.cancel = cancel
        waits = Waits(steps, steps.note, is_async=True)
    try:
        async with deadline:
            result = await spec.fn(job.to_job(None if steps is None else AsyncSteps(steps), followups, cancel,
                                              waits))
    except asyncio.CancelledError:
        if cancel is None or not cancel.is_set():
            raise  # the loop is going away, not an operator's cancel
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        return Attempt(Outcome.cancelled(job.id, job.attempt, OPERATOR_CANCEL))
    except TimeoutError as exc:
        if not deadline.expired():  # the handler's own TimeoutError
            return ended(spec, job, steps, exc, waits=waits)
        return Attempt(failure(spec, job, exc, error=f"timed out after {spec.timeout_s:g}s"), exc)
    except Exception as exc:
        return ended(spec, job, steps, exc, waits=waits)
    except BaseException:
        if suspended(waits):  # the Suspend of a wait, maybe inside a BaseExceptionGroup (a TaskGroup's)
            return ended(spec, job, steps, waits=waits)
        raise
    finally:
        if waits is not None:
            waits.flush()
    return ended(spec, job, steps, result=result, followups=followups, waits=waits)


def suspended(waits: Waits | None) -> bool:
    """Whether the run reached a wait (``Suspend`` was raised, whoever caught or wrapped it)."""
    return waits is not None and waits.wait is not None


def cancelled_before(job: ClaimedJob, cancel: Flag | None) -> Attempt | None:
    """The attempt of a job an operator cancelled before its handler started: it never starts."""
    if cancel is None or not cancel.is_set():
        return None
    return Attempt(Outcome.cancelled(job.id, job.attempt, OPERATOR_CANCEL))


def ended(spec: HandlerSpec, job: ClaimedJob, steps: StepLog | None, exc: Exception | None = None,
          result: object = None, followups: FollowUps | None = None, waits: Waits | None = None) -> Attempt:
    """The attempt of a handler that raised ``exc`` or returned ``result``. One that misused a
    step failed, whatever it did after (caught the ``StepError``, returned, raised something else);
    one that reached a wait is suspended, whatever it did after (caught the ``Suspend``)."""
    if steps is not None and steps.not_run == "cancelled":  # a step the cancel kept from starting
        return Attempt(Outcome.cancelled(job.id, job.attempt, OPERATOR_CANCEL))
    if steps is not None and steps.not_run == "held back":  # not the handler's doing: given back, uncharged
        return Attempt(Outcome.snoozed(job.id, job.attempt, 0.0))
    if steps is not None and steps.error is not None:
        return Attempt(failure(spec, job, steps.error), steps.error)
    if waits is not None and waits.wait is not None:
        return Attempt(Outcome.suspended(job.id, job.attempt, waits.extras(sends=True) or b"{}"))
    if isinstance(exc, EventTimeout):  # recorded: every retry would meet it again at the same wait
        return Attempt(never_again(job, printable(f"EventTimeout: {exc} (it fails for good: every retry would time "
                                                  "out again at the same wait; catch it to go on)")), exc)
    if isinstance(exc, JobControl):
        outcome = controlled(job, exc)
        if outcome.disposition is Disposition.SNOOZED and waits is not None and waits.sent:
            outcome = replace(outcome, extras_json=waits.extras(sends=True))
        return Attempt(outcome, exc if outcome.disposition in FAILURES else None)
    if exc is not None:
        return Attempt(failure(spec, job, exc), exc)
    attempt = success(job, result, followups)
    if waits is not None and waits.sent and attempt.outcome.disposition is Disposition.DONE:  # events to send
        return attempt._replace(outcome=replace(attempt.outcome, extras_json=waits.extras(sends=True)))
    return attempt


def success(job: ClaimedJob, result: object, followups: FollowUps | None = None) -> Attempt:
    """The outcome of a returned value, with the follow-up jobs the handler enqueued, or a
    final failure when it cannot be stored.

    The result stays the bytes orjson produced, all the way to PostgreSQL."""
    try:
        return Attempt(Outcome.done(job.id, job.attempt, storable_json(result),
                                    followups.encode() if followups else None))
    except Unstorable as exc:  # running it again would compute the same value
        return Attempt(never_again(job, f"handler {exc}"), exc)


def controlled(job: ClaimedJob, control: JobControl) -> Outcome:
    """The outcome a handler asked for by raising ``Retry``, ``Snooze``, ``Fail`` or ``Cancel``."""
    if isinstance(control, Snooze):
        return Outcome.snoozed(job.id, job.attempt, control.delay_s)
    if isinstance(control, Cancel):
        return Outcome.cancelled(job.id, job.attempt, printable(control.reason))
    if isinstance(control, Retry):  # the job row fails it when no attempt remains
        return Outcome.retry(job.id, job.attempt, printable(f"Retry: {control.reason or 'retry requested'}"),
                             control.delay_s, failed_at=time.time())
    if isinstance(control, Fail):
        return never_again(job, printable(f"Fail: {control.reason}"))
    return never_again(job, f"unknown job control {type(control).__name__}")


def never_again(job: ClaimedJob, reason: str) -> Outcome:
    """A failure that no retry can fix."""
    return Outcome.failed(job.id, job.attempt, reason, failed_at=time.time())


def refused(job: ClaimedJob, reason: str) -> Attempt:
    """A run refused before its handler started: failed for good, ``Fail(reason)`` for ``app.on_failure``."""
    return Attempt(never_again(job, reason), Fail(reason))


def input_refused(job: ClaimedJob) -> Attempt | None:
    """A final failure for a payload over ``MAX_PAYLOAD_BYTES`` (only SQL written by hand
    can store one: ``enqueue`` refuses it), or for recorded steps and dependency results
    over ``MAX_JOB_INPUT_BYTES`` (the claim left them behind: ``ClaimedJob.withheld``); else
    None. Running such a job again would meet the same input."""
    if job.withheld is not None:
        return refused(job, withheld_reason(job.id, *job.withheld))
    if len(job.payload_json) * 4 <= MAX_PAYLOAD_BYTES:  # UTF-8 takes at most 4 bytes a character
        return None
    size = len(job.payload_json.encode("utf-8", "surrogatepass"))
    if size <= MAX_PAYLOAD_BYTES:
        return None
    return refused(job, f"payload too large: {size} bytes of JSON, the limit is {MAX_PAYLOAD_BYTES} "
                            "(shardworker.core.limits.MAX_PAYLOAD_BYTES)")


def withheld_reason(job_id: int, steps_bytes: int, deps_bytes: int) -> str:
    """Why a job whose input the claim left behind is not run, and what the operator can do."""
    held = [f"its recorded steps hold {steps_bytes:,} bytes of JSON"] if steps_bytes else []
    if deps_bytes:
        held.append(f"the results of the jobs it waited on hold {deps_bytes:,}")
    remedy = [f"`shardworker jobs retry {job_id} --reset-steps` runs it from its first step"] if steps_bytes else []
    if deps_bytes:
        remedy.append("results that keep a key to data stored elsewhere stay small")
    return (f"input too large: {' and '.join(held)}, over the {MAX_JOB_INPUT_BYTES:,} a run may be given "
            f"(shardworker.core.limits.MAX_JOB_INPUT_BYTES); {'; '.join(remedy)}")


def failure(spec: HandlerSpec, job: ClaimedJob, exc: BaseException, *, error: str | None = None) -> Outcome:
    """A failed attempt: the error, its traceback (bounded), when it failed, retried after the
    handler's delay."""
    message = error or f"{type(exc).__name__}: {exc}"
    delay = spec.delay_after_failure(job.attempt)
    return Outcome.after_failure(job.id, job.attempt, printable(message), delay,
                                 traceback=bounded_traceback(exc), failed_at=time.time())


def bounded_traceback(exc: BaseException) -> str:
    """``exc``'s traceback as Python prints it, at most ``MAX_TRACEBACK_BYTES`` of UTF-8: a
    longer one (a deep recursion) keeps its end, where the error is, after a line saying
    how much was cut."""
    frames = exc.__traceback__
    if frames is not None and frames.tb_next is not None and frames.tb_frame.f_code.co_filename == __file__:
        frames = frames.tb_next  # from the handler's frame on: this module's own says nothing
    text = printable("".join(traceback.format_exception(type(exc), exc, frames)).strip())
    data = text.encode("utf-8")
    if len(data) <= MAX_TRACEBACK_BYTES:
        return text
    marker = "… {} bytes cut …\n"
    keep = MAX_TRACEBACK_BYTES - len(marker.format(len(data)).encode("utf-8"))
    tail = data[len(data) - keep:].decode("utf-8", "ignore")
    return marker.format(len(data) - len(tail.encode("utf-8"))) + tail


def printable(text: str) -> str:
    """``text`` as valid UTF-8 without NUL: lone surrogates and NULs escaped, never dropped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
