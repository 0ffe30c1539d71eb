"""Running one handler, sync or ``async def``, and turning whatever happens into an Outcome.

Whatever a handler does, the outcome is storable: an exception message with a lone
surrogate or a NUL byte is escaped, a ``retry_delay`` that raises or returns NaN falls back
to the default backoff, one that returns infinity means "do not retry", a result
PostgreSQL's jsonb cannot hold (``\\u0000``) or orjson cannot encode fails the job for good
with the reason. The exceptions of ``shardworker.control`` steer the job instead
(``controlled``). Only ``BaseException``s that are not ``Exception`` (a KeyboardInterrupt,
SystemExit) escape, and end the child.
"""

from __future__ import annotations

import asyncio
import threading
import traceback

from shardworker.app import App, HandlerSpec
from shardworker.child.cancels import OPERATOR_CANCEL
from shardworker.child.followups import FollowUps
from shardworker.child.results import Unstorable, storable_json
from shardworker.child.steps import AsyncSteps, StepLog, SyncSteps
from shardworker.control import Cancel, Fail, JobControl, Retry, Snooze
from shardworker.limits import MAX_PAYLOAD_BYTES
from shardworker.model import ClaimedJob, Outcome


def run_sync(app: App, job: ClaimedJob, steps: StepLog | None = None,
             cancel: threading.Event | None = None) -> Outcome:
    """Run a sync handler to its end (timeouts of sync handlers, and cancels it does not
    heed, are the parent's to enforce); ``steps`` runs its ``job.step`` calls, ``cancel``
    is its ``job.cancelled`` (already set: the handler is not called)."""
    spec = app.handlers.get(job.kind)
    if spec is None:
        return unknown_kind(job)
    refused = payload_refused(job) or cancelled_before(job, cancel)
    if refused is not None:
        return refused
    followups = FollowUps()
    try:
        result = spec.fn(job.to_job(None if steps is None else SyncSteps(steps), followups, cancel))
    except JobControl as control:
        return step_misuse(spec, job, steps) or controlled(job, control)
    except Exception as exc:
        return step_misuse(spec, job, steps) or failure(spec, job, exc)
    return step_misuse(spec, job, steps) or success(job, result, followups)


async def run_async(app: App, job: ClaimedJob, steps: StepLog | None = None,
                    cancel: threading.Event | None = None) -> Outcome:
    """Await an ``async def`` handler; past its ``timeout_s`` it is cancelled and the attempt
    fails. An operator's cancel (``cancel`` set, then the task cancelled by its lane) ends
    it as cancelled."""
    spec = app.handlers.get(job.kind)
    if spec is None:
        return unknown_kind(job)
    refused = payload_refused(job) or cancelled_before(job, cancel)
    if refused is not None:
        return refused
    deadline = asyncio.timeout(spec.timeout_s)
    followups = FollowUps()
    try:
        async with deadline:
            result = await spec.fn(job.to_job(None if steps is None else AsyncSteps(steps), followups, cancel))
    except asyncio.CancelledError:
        if cancel is None or not cancel.is_set():
            raise  # the loop is going away, not an operator's cancel
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        return Outcome.cancelled(job.id, job.attempt, OPERATOR_CANCEL)
    except TimeoutError as exc:
        expired = f"timed out after {spec.timeout_s:g}s" if deadline.expired() else None
        return failure(spec, job, exc, error=expired)  # else the handler's own TimeoutError
    except JobControl as control:
        return step_misuse(spec, job, steps) or controlled(job, control)
    except Exception as exc:
        return step_misuse(spec, job, steps) or failure(spec, job, exc)
    return step_misuse(spec, job, steps) or success(job, result, followups)


def step_misuse(spec: HandlerSpec, job: ClaimedJob, steps: StepLog | None) -> Outcome | None:
    """The failed attempt of a handler that misused a step, whatever it did after (caught
    the ``StepError``, returned, raised something else); None when it did not."""
    if steps is None or steps.error is None:
        return None
    return failure(spec, job, steps.error)


def cancelled_before(job: ClaimedJob, cancel: threading.Event | None) -> Outcome | None:
    """The outcome of a job an operator cancelled before its handler started: it never starts."""
    if cancel is None or not cancel.is_set():
        return None
    return Outcome.cancelled(job.id, job.attempt, OPERATOR_CANCEL)


def unknown_kind(job: ClaimedJob) -> Outcome:
    return never_again(job, f"no handler for kind {job.kind!r}")


def success(job: ClaimedJob, result: object, followups: FollowUps | None = None) -> Outcome:
    """The outcome of a returned value, with the follow-up jobs the handler enqueued, or a
    final failure when it cannot be stored.

    The result stays the bytes orjson produced, all the way to PostgreSQL."""
    try:
        return Outcome.done(job.id, job.attempt, storable_json(result), followups.encode() if followups else None)
    except Unstorable as exc:
        return never_again(job, f"handler {exc}")  # running it again would compute the same value


def controlled(job: ClaimedJob, control: JobControl) -> Outcome:
    """The outcome a handler asked for by raising ``Retry``, ``Snooze``, ``Fail`` or ``Cancel``."""
    if isinstance(control, Snooze):
        return Outcome.snoozed(job.id, job.attempt, control.delay_s)
    if isinstance(control, Cancel):
        return Outcome.cancelled(job.id, job.attempt, printable(control.reason))
    if isinstance(control, Retry):  # the job row fails it when no attempt remains
        return Outcome.retry(job.id, job.attempt, printable(f"Retry: {control.reason or 'retry requested'}"),
                             control.delay_s)
    if isinstance(control, Fail):
        return never_again(job, printable(f"Fail: {control.reason}"))
    return never_again(job, f"unknown job control {type(control).__name__}")


def never_again(job: ClaimedJob, reason: str) -> Outcome:
    """A failure that no retry can fix."""
    return Outcome.failed(job.id, job.attempt, reason)


def payload_refused(job: ClaimedJob) -> Outcome | None:
    """A final failure for a payload over ``MAX_PAYLOAD_BYTES`` (only SQL written by hand
    can store one: ``enqueue`` refuses it), else None."""
    if len(job.payload_json) * 4 <= MAX_PAYLOAD_BYTES:  # UTF-8 takes at most 4 bytes a character
        return None
    size = len(job.payload_json.encode("utf-8", "surrogatepass"))
    if size <= MAX_PAYLOAD_BYTES:
        return None
    return never_again(job, f"payload too large: {size} bytes of JSON, the limit is {MAX_PAYLOAD_BYTES} "
                            "(shardworker.limits.MAX_PAYLOAD_BYTES)")


def failure(spec: HandlerSpec, job: ClaimedJob, exc: BaseException, *, error: str | None = None) -> Outcome:
    """A failed attempt: the error with its traceback, retried after the handler's delay."""
    text = "".join(traceback.format_exception(exc)).strip()
    message = error or f"{type(exc).__name__}: {exc}"
    delay = spec.delay_after_failure(job.attempt)
    return Outcome.after_failure(job.id, job.attempt, printable(f"{message}\n{text}"), delay)


def printable(text: str) -> str:
    """``text`` as valid UTF-8 without NUL: lone surrogates and NULs escaped, never dropped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
