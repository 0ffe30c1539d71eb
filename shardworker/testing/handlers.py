"""Run one handler on one job in-process, on the child's own code, for a test.

``run_handler(app, kind, payload)`` builds the job a worker would claim and runs it through
``shardworker.child.handlers`` (``run_sync``, ``run_async``), so what a test sees is what a
worker's child does: the result as it would be stored (JSON's view of it: a tuple becomes a
list), ``job.step`` recording each step (``steps=`` gives back results of earlier attempts,
which are replayed, not run), ``job.enqueue`` follow-ups (kept only when the run ends done, as
a worker inserts them only then), and ``Retry``, ``Snooze``, ``Fail`` and ``Cancel`` as the
run's ``status``. A handler's own exception (and a misused step's ``StepError``) is raised
as itself, for ``pytest.raises``; ``raises=False`` keeps it as the worker would: a ``retry``
(or ``failed``) status with the error and its traceback. ``async def`` handlers run on an
event loop with their ``timeout_s``; ``threads=True`` handlers on a thread of their own; a sync
handler's timeout is the worker's parent's to enforce, so it is not enforced here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import orjson

from shardworker.app import App, HandlerSpec
from shardworker.child.handlers import run_async, run_sync
from shardworker.child.steps import StepLog
from shardworker.control import JobControl
from shardworker.core import followups, records
from shardworker.core.limits import DEFAULT_MAX_ATTEMPTS
from shardworker.core.model import (
    ClaimedJob,
    Disposition,
    Outcome,
    ProgressRecord,
    StepRecord,
    dumps_exact,
    loads_exact,
)


class HandlerFailed(AssertionError):
    """The run did not end done (read its ``status`` and ``error``), or ``result`` was read of one
    that did not."""


class FollowUpJob(NamedTuple):
    """A job the handler enqueued with ``job.enqueue``: ``after`` holds the job ids it waits on,
    ``after_followups`` the indexes (in ``HandlerRun.followups``) of follow-ups of the same run."""

    kind: str
    payload: Any
    queue: str
    priority: int
    max_attempts: int
    delay_s: float
    dedupe_key: str | None
    after: tuple[int, ...]
    after_followups: tuple[int, ...]
    key: str | None = None


@dataclass(frozen=True)
class HandlerRun:
    """How a run ended: ``status`` is ``done``, ``retry`` (run again after ``delay_s`` while
    attempts remain), ``failed`` (for good), ``snoozed`` (again after ``delay_s``, no attempt
    used), ``suspended`` (at a ``job.sleep`` or ``job.wait_event``: ``wait`` says which, as
    ``{"kind": "sleep", "name", "until"}`` or ``{"kind": "event", "name", "key", "until"}``)
    or ``cancelled``; ``error`` the text a worker would store (``traceback``: a failed
    attempt's traceback, kept apart as the job's ``errors`` history keeps it); ``steps`` what this run
    recorded, ``replayed`` the names given back from ``steps=``; ``followups`` what lands with
    a done outcome; ``events`` the (key, payload) it sent (``job.send_event``), ``progress`` every
    value it reported (``job.progress``); ``outcome`` the record a child would write.

    To run a handler past a wait, give the wait's end in ``steps=``, as the database records it:
    ``{"nap": {"slept_until": 0}}`` for ``job.sleep("nap", …)``, ``{"approval": {"event": payload}}``
    for ``job.wait_event("approval", …)`` (``{"timeout": true}``: it raises ``EventTimeout``)."""

    status: str
    error: str | None
    delay_s: float
    steps: dict[str, Any]
    replayed: list[str]
    followups: list[FollowUpJob]
    outcome: Outcome = field(repr=False)
    _result: Any = field(default=None, repr=False)
    wait: dict[str, Any] | None = None
    events: list[tuple[str, Any]] = field(default_factory=list)
    progress: list[Any] = field(default_factory=list)

    @property
    def traceback(self) -> str | None:
        return self.outcome.traceback

    @property
    def result(self) -> Any:
        """The handler's result as stored; ``HandlerFailed`` when the run did not end done."""
        if self.status != "done":
            why = f": {self.error}" if self.error else f" (at its wait {self.wait['name']!r})" if self.wait else ""
            raise HandlerFailed(f"the run ended {self.status}, not done{why}")
        return self._result


class _Trap:
    """Wraps a handler to keep the exception it raised (the child turns it into text)."""

    def __init__(self, spec: HandlerSpec) -> None:
        self.error: Exception | None = None
        self.spec = replace(spec, fn=self._async(spec.fn) if spec.is_async else self._sync(spec.fn))

    def _sync(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def handler(job: Any) -> Any:
            try:
                return fn(job)
            except Exception as exc:
                self.error = exc
                raise
        return handler

    def _async(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        async def handler(job: Any) -> Any:
            try:
                return await fn(job)
            except Exception as exc:
                self.error = exc
                raise
        return handler


class _Run:
    """One run's parts: the claimed job, its step log (records kept here), the trapped handler."""

    def __init__(self, app: App, kind: str, payload: Any, *, steps: Mapping[str, Any] | None, job_id: int,
                 queue: str, attempt: int, max_attempts: int | None, snoozes: int,
                 dependencies: Mapping[int, Any] | None, key: str | None = None) -> None:
        spec = app.handlers.get(kind)
        if spec is None:
            raise KeyError(f"no handler for kind {kind!r} in this App (it has {', '.join(app.kinds) or 'none'})")
        self.trap = _Trap(spec)
        self.app = App()
        self.app.handlers[kind] = self.trap.spec
        limit = max_attempts or spec.max_attempts or DEFAULT_MAX_ATTEMPTS
        self.job = ClaimedJob(job_id, kind, queue, dumps_exact(payload).decode(), attempt, limit,
                              None if not steps else dumps_exact(dict(steps)).decode(),
                              None if not dependencies else dumps_exact({str(k): v for k, v in dependencies.items()})
                              .decode(), snoozes, key=key)
        self.recorded: list[StepRecord] = []
        self.progress: list[Any] = []
        self.log = StepLog(self.job, self._sink, self._commit, note=self._note)

    def _note(self, record: bytes) -> None:
        """A record the run appends without waiting: its progress, or a wait it passed (the
        wait's end, given in ``steps=``, which a worker keeps in the outbox again: not a step
        this run recorded)."""
        noted = records.decode_record(record)
        if isinstance(noted, ProgressRecord):
            self.progress.append(loads_exact(noted.value_json.decode()))

    def _commit(self, record: bytes) -> None:
        step = records.decode_record(record)
        assert isinstance(step, StepRecord)
        self.recorded.append(step)

    def _sink(self, record: bytes, on_durable: Callable[[], None]) -> None:
        self._commit(record)
        on_durable()

    def finish(self, outcome: Outcome, raises: bool) -> HandlerRun:
        """The run's ``HandlerRun``, or (with ``raises``) the handler's exception raised."""
        status = outcome.disposition.value
        if outcome.disposition is Disposition.RETRY and self.job.attempts_used >= self.job.max_attempts:
            status = "failed"  # as the row does: no attempt left (job_apply_outcomes)
        asked = ((isinstance(self.trap.error, JobControl) or outcome.disposition is Disposition.SUSPENDED)
                 and self.log.error is None)
        if raises and outcome.disposition is not Disposition.DONE and not asked:
            raise self.log.error or self.trap.error or HandlerFailed(f"the run ended {status}: {outcome.error}")
        result = loads_exact(outcome.result_json.decode()) if outcome.result_json is not None else None
        extras = loads_exact(outcome.extras_json.decode()) if outcome.extras_json else {}
        return HandlerRun(status, outcome.error, outcome.delay_s,
                          {s.name: loads_exact(s.result_json.decode()) for s in self.recorded},
                          [name for name in sorted(self.log.used) if name in self.log.earlier],
                          _followups(outcome.followups_json), outcome, result, extras.get("wait"),
                          [(key, payload) for key, payload, _ in extras.get("events", ())], self.progress)


def _followups(blob: bytes | None) -> list[FollowUpJob]:
    if blob is None:
        return []
    return [FollowUpJob(row.kind, orjson.loads(row.payload_json), row.queue, row.priority, row.max_attempts,
                        row.delay_s, row.dedupe_key, tuple(ref for ref in row.after if ref > 0),
                        tuple(-ref - 1 for ref in row.after if ref < 0), row.key)
            for row in followups.decode(blob)]


def run_handler(app: App, kind: str, payload: Any = None, *, steps: Mapping[str, Any] | None = None,
                raises: bool = True, job_id: int = 1, queue: str = "default", attempt: int = 1,
                max_attempts: int | None = None, snoozes: int = 0,
                dependencies: Mapping[int, Any] | None = None, key: str | None = None) -> HandlerRun:
    """Run ``app``'s handler of ``kind`` on a job with ``payload`` (and the job's other fields),
    as a worker's child would; ``steps``: {name: result} recorded by earlier attempts. Call
    ``run_handler_async`` instead from a running event loop for an ``async def`` handler."""
    run = _Run(app, kind, payload, steps=steps, job_id=job_id, queue=queue, attempt=attempt,
               max_attempts=max_attempts, snoozes=snoozes, dependencies=dependencies, key=key)
    lane = run.trap.spec.lane
    if lane == "async":
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return run.finish(asyncio.run(run_async(run.app, run.job, run.log)), raises)
        raise RuntimeError(f"{kind!r} is an async def handler and an event loop is running: "
                           "use `await run_handler_async(...)`")
    if lane == "threads":
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="shardworker-test") as pool:
            return run.finish(pool.submit(run_sync, run.app, run.job, run.log).result(), raises)
    return run.finish(run_sync(run.app, run.job, run.log), raises)


async def run_handler_async(app: App, kind: str, payload: Any = None, *, steps: Mapping[str, Any] | None = None,
                            raises: bool = True, job_id: int = 1, queue: str = "default", attempt: int = 1,
                            max_attempts: int | None = None, snoozes: int = 0,
                            dependencies: Mapping[int, Any] | None = None, key: str | None = None) -> HandlerRun:
    """``run_handler`` from asyncio code: an ``async def`` handler runs on this event loop; a
    sync or threaded one on a thread, so the loop never blocks."""
    run = _Run(app, kind, payload, steps=steps, job_id=job_id, queue=queue, attempt=attempt,
               max_attempts=max_attempts, snoozes=snoozes, dependencies=dependencies, key=key)
    if run.trap.spec.lane == "async":
        return run.finish(await run_async(run.app, run.job, run.log), raises)
    return run.finish(await asyncio.to_thread(run_sync, run.app, run.job, run.log), raises)
