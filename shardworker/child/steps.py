"""``job.step``: a part of a job that runs once, ever, whatever attempt asks for it.

A step's result is appended to the child's outbox shard as a step record
(``shardworker.core.wire.encode_step``) in the same group commit as outcomes, and the step returns
only once that record is fsync'd: whatever the handler does next happens only after the step
is durable. The flusher lands step records in ``shardworker.job_steps`` with the outcomes
(first recorded wins), and a later attempt receives them with its claim (``steps_json``):
``job.step`` then gives the recorded result back without calling ``fn``.

Either way the handler gets the result as JSON gives it back (a tuple becomes a list), so the
code after a step sees the same value on the first run and on a replay.

A misused step fails the attempt and records nothing (``StepError``): a name used twice in
one run, a name that is not a non-empty string of at most ``MAX_STEP_NAME_CHARS``, a result
that is not JSON or is over the result limit, more than ``MAX_STEPS`` steps in a job. The
attempt fails even if the handler catches the error. An exception from ``fn`` propagates
unrecorded, and so do ``Retry``, ``Snooze``, ``Fail`` and ``Cancel``: they act as if the
handler raised them.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

from shardworker.child.cancels import Flag
from shardworker.child.gate import GATE_POLL_S, StartGate
from shardworker.child.results import Unstorable, storable_json
from shardworker.core import tracing, wire
from shardworker.core.model import ClaimedJob, StepRecord, loads_exact
from shardworker.errors import StepError

MAX_STEPS = 10_000  # step names a job may record, over all its attempts
MAX_STEP_NAME_CHARS = 200

# How a step record reaches the outbox: from an event loop, (record, on_durable), which
# returns at once and calls on_durable on the committer's thread once the record is fsync'd;
# from a handler thread, (record), which returns once it is fsync'd.
Sink = Callable[[bytes, Callable[[], None]], None]
Commit = Callable[[bytes], None]


class Suspend(BaseException):
    """The run ends at a wait (``job.sleep``, ``job.wait_event``: ``shardworker.child.waits``);
    raised out of the handler, past ``except Exception``. Catching it does not help: the run
    ends suspended all the same, and every step, wait or send it tries after is refused so."""


class StepNotRun(Exception):
    """A step not recorded yet that this attempt may not run: an operator cancelled the attempt,
    or it waited for the start gate until the child stopped."""


class StepLog:
    """One attempt's steps: those recorded by earlier attempts, and the names used in this run.

    ``gate`` is the child's start gate: a step not recorded yet runs only while it is open, as
    a job starts only then (past it, a peer may have rescued the job and be running its steps).
    Closed, the step waits for a beat to open it; ``stopping`` ends that wait without running
    it. Nor does a step run once ``cancel`` (the attempt's ``job.cancelled``) is set (``held``)."""

    def __init__(self, job: ClaimedJob, sink: Sink, commit: Commit, gate: StartGate | None = None,
                 stopping: Callable[[], bool] = lambda: False, note: Callable[[bytes], None] | None = None) -> None:
        self.job, self.sink, self.commit, self.gate, self.stopping = job, sink, commit, gate, stopping
        self.note = note  # appends a record without waiting for it (job.progress: shardworker.child.waits)
        self.suspended = False  # the run reached a wait: nothing more of it counts (Suspend again)
        self._earlier: dict[str, Any] | None = None  # decoded on first use
        self.used: set[str] = set()
        self.recorded = 0  # steps this run recorded
        self.replayed = 0  # steps this run got back from earlier attempts
        self.error: StepError | None = None  # the first misuse, which fails the attempt
        self.cancel: Flag | None = None  # the attempt's cancel flag (``job.cancelled``), set by its runner
        # Why a new step was not run, which ends the attempt: "cancelled" (ends cancelled), or "held
        # back" (it waited at the closed gate until a stop: snoozed, uncharged).
        self.not_run: str | None = None

    @property
    def earlier(self) -> dict[str, Any]:
        if self._earlier is None:
            self._earlier = loads_exact(self.job.steps_json) if self.job.steps_json else {}
        return self._earlier

    def fail(self, message: str) -> StepError:
        error = StepError(message)
        if self.error is None:
            self.error = error
        return error

    def begin(self, name: object) -> tuple[bool, Any]:
        """(True, result) for a step an earlier attempt recorded, else (False, None); raises
        ``StepError`` for a bad or repeated name, or a step past ``MAX_STEPS``, and ``Suspend``
        once the run reached a wait (a ``finally`` that steps while the wait unwinds the handler)."""
        if self.suspended:
            raise Suspend(f"job {self.job.id}: the run ended at a wait; step {name!r:.80} is for its next run")
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_STEP_NAME_CHARS or "\x00" in name:
            raise self.fail(f"job {self.job.id}: a step name must be a string of 1 to {MAX_STEP_NAME_CHARS} "
                            f"characters without NUL, not {name!r:.80}")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise self.fail(f"job {self.job.id}: step name {name!r:.80} is not valid Unicode") from None
        if name in self.used:
            raise self.fail(f"step {name!r} ran twice in one attempt of job {self.job.id}: "
                            "step names must be unique within a job")
        self.used.add(name)
        if name in self.earlier:
            self.replayed += 1
            return True, self.earlier[name]
        if len(self.earlier) + self.recorded >= MAX_STEPS:
            raise self.fail(f"step {name!r}: job {self.job.id} already holds {MAX_STEPS} steps, the most a job "
                            "may record (shardworker.child.steps.MAX_STEPS)")
        return False, None

    def held(self, name: str) -> bool:
        """Whether step ``name`` must wait for the gate. ``StepNotRun`` once the attempt was
        cancelled (it ends cancelled: a retry may be running the steps), or once the child
        stops while the gate is closed (it ends snoozed, uncharged: stale if a peer rescued the
        job, else run again from its recorded steps); whatever the handler does with it."""
        if self.cancel is not None and self.cancel.is_set():
            self.not_run = "cancelled"
            raise StepNotRun(f"step {name!r} of job {self.job.id} not run: the attempt was cancelled")
        if self.gate is None or self.gate.open():
            return False
        if self.stopping():
            self.not_run = "held back"
            raise StepNotRun(f"step {name!r} of job {self.job.id} not run: the worker stopped while its "
                             "heartbeat was overdue")
        return True

    def encode(self, name: str, result: Any) -> tuple[bytes, Any]:
        """The step record of ``result`` and the value the handler gets (``result`` as JSON
        gives it back); ``StepError`` when the result cannot be stored."""
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise self.fail(f"step {name!r} of job {self.job.id} returned an awaitable: await the step "
                            "in an async def handler (a sync handler's step runs a plain function)")
        try:
            result_json = storable_json(result)
        except Unstorable as exc:
            raise self.fail(f"step {name!r} of job {self.job.id}: {exc}") from None
        record = wire.encode_step(StepRecord(self.job.id, self.job.attempt, name, result_json, time.time(), self.job.uid))
        return record, loads_exact(result_json.decode("utf-8"))


class SyncSteps:
    """``job.step`` in a sync handler (one at a time or ``threads=True``): the call blocks
    until the step's record is durable."""

    def __init__(self, log: StepLog) -> None:
        self.log = log

    def run(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        found, value = self.log.begin(name)
        if found:
            return value
        while self.log.held(name):
            time.sleep(GATE_POLL_S)
        with tracing.step(name):
            result = fn(*args, **kwargs)
        record, value = self.log.encode(name, result)
        self.log.commit(record)
        self.log.recorded += 1
        return value


class AsyncSteps:
    """``job.step`` in an ``async def`` handler: an awaitable; ``fn`` may be a coroutine
    function. The event loop goes on while the record is fsync'd."""

    def __init__(self, log: StepLog) -> None:
        self.log = log

    async def run(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        found, value = self.log.begin(name)
        if found:
            return value
        while self.log.held(name):
            await asyncio.sleep(GATE_POLL_S)
        with tracing.step(name):
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        record, value = self.log.encode(name, result)
        loop = asyncio.get_running_loop()
        durable = loop.create_future()

        def wake() -> None:
            loop.call_soon_threadsafe(_settle, durable)

        self.log.sink(record, wake)
        await durable
        self.log.recorded += 1
        return value


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
