"""Where a child runs handlers: lanes, each with its own way of running several at once.

* ``ThreadLane(1)``: plain sync handlers, one at a time, in arrival order (CPU-bound work
  scales with ``--procs``).
* ``ThreadLane(C)``: sync handlers registered with ``threads=True``, up to ``C`` at once.
* ``AsyncLane(C)``: ``async def`` handlers on the child's event loop (``hooks.EventLoop``,
  uvloop when installed), up to ``C`` at once; a handler over its ``timeout_s`` is
  cancelled and fails that attempt, one an operator cancelled (``cancel(keys)``) is
  cancelled and ends cancelled.

A failed attempt's ``app.on_failure`` hooks run on the lane (``hooks.Hooks``) before its
outcome is handed on, within the attempt's time.

A lane calls ``on_start(slot, job)`` when a handler starts and ``on_done(slot, job,
outcome, started_at, steps)`` when it has an outcome (``steps``: the run's ``StepLog``, made
by ``steps_for(job)``); both run on the lane's thread. A handler sees its job's flag in
``cancels`` (``shardworker.child.cancels``) as ``job.cancelled``. ``withdraw()``
takes back the jobs submitted and not started (the lane goes on with the next it is
given): a job is either returned or started, never both, since a job leaves the queue
under the same lock (or on the same loop) that ``withdraw`` takes it under. ``stop()``
stops starting new jobs and returns those never started; ``join()`` waits for the
running ones. A lane starts a job only while its ``StartGate`` is open: while the parent's
heartbeat says no peer can have rescued this worker's jobs (``shardworker.worker.heartbeat``).
Lanes know nothing of the outbox, the pipe or the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from shardworker.app import App
from shardworker.child.cancels import Cancels
from shardworker.child.gate import GATE_POLL_S, StartGate
from shardworker.child.handlers import attempt_async, attempt_sync
from shardworker.child.hooks import Hooks
from shardworker.child.steps import StepLog
from shardworker.core.model import ClaimedJob, Outcome

OnStart = Callable[[int, ClaimedJob], None]
OnDone = Callable[[int, ClaimedJob, Outcome, float, StepLog], None]
StepsFor = Callable[[ClaimedJob], StepLog]


class Lane(Protocol):
    def submit(self, jobs: list[tuple[int, ClaimedJob]]) -> None: ...
    def withdraw(self) -> list[tuple[int, ClaimedJob]]: ...
    def stop(self) -> list[tuple[int, ClaimedJob]]: ...
    def join(self, timeout_s: float | None = None) -> None: ...
    def cancel(self, keys: list[tuple[int, int]]) -> None: ...


class ThreadLane:
    """``threads`` threads taking jobs from one queue, in arrival order."""

    def __init__(self, app: App, threads: int, on_start: OnStart, on_done: OnDone, steps_for: StepsFor,
                 name: str, cancels: Cancels, hooks: Hooks, gate: StartGate | None = None) -> None:
        self.app, self.on_start, self.on_done, self.steps_for = app, on_start, on_done, steps_for
        self.cancels, self.hooks, self.gate = cancels, hooks, gate or StartGate()
        self._queue: deque[tuple[int, ClaimedJob]] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, jobs: list[tuple[int, ClaimedJob]]) -> None:
        """Queue ``(slot, job)`` pairs, in order, and wake as many threads."""
        with self._cond:
            self._queue.extend(jobs)
            self._cond.notify(len(jobs))

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not (self._queue and self.gate.open()):
                    self._cond.wait(GATE_POLL_S if self._queue else None)
                if self._stopping:
                    return
                slot, job = self._queue.popleft()
            self.on_start(slot, job)
            started_at = time.monotonic()
            steps = self.steps_for(job)
            attempt = attempt_sync(self.app, job, steps, self.cancels.hold((job.id, job.attempt)))
            if attempt.error is not None:
                self.hooks.failed(job, attempt.error)
            self.on_done(slot, job, attempt.outcome, started_at, steps)

    def cancel(self, keys: list[tuple[int, int]]) -> None:
        """Nothing beyond the flags: a sync handler polls ``job.cancelled``."""

    def withdraw(self) -> list[tuple[int, ClaimedJob]]:
        """The jobs still queued, in order; they will not start here."""
        with self._cond:
            unstarted, self._queue = list(self._queue), deque()
        return unstarted

    def stop(self) -> list[tuple[int, ClaimedJob]]:
        with self._cond:
            self._stopping = True
            unstarted, self._queue = list(self._queue), deque()
            self._cond.notify_all()
        return unstarted

    def join(self, timeout_s: float | None = None) -> None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))


class AsyncLane:
    """Up to ``concurrency`` handlers at once on the child's event loop."""

    def __init__(self, app: App, concurrency: int, on_start: OnStart, on_done: OnDone, steps_for: StepsFor,
                 cancels: Cancels, hooks: Hooks, gate: StartGate | None = None) -> None:
        self.app, self.on_start, self.on_done, self.steps_for = app, on_start, on_done, steps_for
        self.cancels, self.hooks, self.gate = cancels, hooks, gate or StartGate()
        self._look_again: asyncio.TimerHandle | None = None  # while the gate is closed
        self._running: dict[tuple[int, int], asyncio.Task[None]] = {}  # the tasks of started handlers
        self.loop = hooks.events.loop
        self._free = concurrency  # handlers that may start now
        self._tasks: set[asyncio.Task[None]] = set()
        self._waiting: dict[int, ClaimedJob] = {}  # submitted, not yet started (by slot), in order
        self._stopping = False

    def submit(self, jobs: list[tuple[int, ClaimedJob]]) -> None:
        """Queue ``(slot, job)`` pairs, in order, and start what fits: one wake-up of the loop for them all."""
        self.loop.call_soon_threadsafe(self._queue, jobs)

    def _queue(self, jobs: list[tuple[int, ClaimedJob]]) -> None:
        self._waiting.update(jobs)
        self._start_what_fits()

    def _start_what_fits(self) -> None:
        """A task for each waiting job while a handler may start. A job waits without a task
        (tasks blocked on a semaphore would cost each acquire a scan of all the waiters)."""
        if self._free > 0 and self._waiting and not self._stopping and not self.gate.open():
            if self._look_again is None:
                self._look_again = self.loop.call_later(GATE_POLL_S, self._gate_poll)
            return
        while self._free > 0 and self._waiting and not self._stopping:
            slot = next(iter(self._waiting))
            job = self._waiting.pop(slot)
            self._free -= 1
            task = self.loop.create_task(self._run(slot, job))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _gate_poll(self) -> None:
        self._look_again = None
        self._start_what_fits()

    async def _run(self, slot: int, job: ClaimedJob) -> None:
        try:
            if not self.gate.open():  # closed since the task was made (a handler blocked the loop meanwhile)
                self._waiting = {slot: job, **self._waiting}
                return
            self.on_start(slot, job)
            started_at = time.monotonic()
            steps = self.steps_for(job)
            key = (job.id, job.attempt)
            task = asyncio.current_task()
            if task is not None:
                self._running[key] = task
            try:
                attempt = await attempt_async(self.app, job, steps, self.cancels.hold(key))
            finally:
                self._running.pop(key, None)
            if attempt.error is not None:
                await self.hooks.failed_async(job, attempt.error)
            self.on_done(slot, job, attempt.outcome, started_at, steps)
        finally:
            self._free += 1
            self._start_what_fits()

    def cancel(self, keys: list[tuple[int, int]]) -> None:
        """Cancel the tasks of these jobs' running handlers (their flags are set already)."""
        def cancel_running() -> None:
            for key in keys:
                task = self._running.get(key)
                if task is not None:
                    task.cancel()

        self.loop.call_soon_threadsafe(cancel_running)

    def withdraw(self) -> list[tuple[int, ClaimedJob]]:
        """The jobs still waiting for a free slot; they will not start here."""
        return asyncio.run_coroutine_threadsafe(self._withdraw(), self.loop).result()

    async def _withdraw(self) -> list[tuple[int, ClaimedJob]]:
        unstarted, self._waiting = list(self._waiting.items()), {}
        return unstarted

    def stop(self) -> list[tuple[int, ClaimedJob]]:
        """Stop starting jobs; those still waiting for a free slot are returned."""
        return asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result()

    async def _stop(self) -> list[tuple[int, ClaimedJob]]:
        self._stopping = True
        unstarted, self._waiting = list(self._waiting.items()), {}
        return unstarted

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for running handlers (up to ``timeout_s``); the loop goes on, for the shutdown hooks."""
        async def drain() -> None:
            while self._tasks:
                await asyncio.wait(set(self._tasks))

        with contextlib.suppress(TimeoutError):
            asyncio.run_coroutine_threadsafe(drain(), self.loop).result(timeout_s)
