"""The app's hooks in a child: ``on_startup`` before its first job, ``on_shutdown`` after its
last, ``on_failure`` for each failed attempt (``shardworker.app``).

A hook may be sync or ``async def``. An async one runs on the child's one event loop
(``EventLoop``), the loop its async handlers run on, so a client a startup hook opens there
serves them; a sync one runs on the calling thread (the child's main thread for startup and
shutdown, the lane's thread for a failure). An async handler's failure hooks run on the loop
(sync ones on a pool thread, so a slow one does not stall the other handlers).

A startup hook that raises is ``HookFailed``, which stops the child before it takes a job
(and the worker with it: ``shardworker.worker.pool``). A shutdown or failure hook that
raises is logged, with its traceback, and the child goes on.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from shardworker.app import App, hook_name
from shardworker.core import logs, procs
from shardworker.core.model import ClaimedJob

log = logging.getLogger(__name__)


class HookFailed(Exception):
    """A startup hook raised; the message names the hook and its error, in one line."""


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when it is installed, else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class EventLoop:
    """The child's event loop on a thread of its own, started when first needed."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = new_event_loop()
                self._thread = threading.Thread(target=self._run, args=(self._loop,), name="shardworker-async",
                                                daemon=True)
                self._thread.start()
            return self._loop

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the loop from another thread, and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self, timeout_s: float | None = None) -> None:
        """End the loop (once its handlers are done) and its thread, if it was started."""
        with self._lock:
            loop, thread = self._loop, self._thread
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout_s)


class Hooks:
    """Runs one app's hooks in this child."""

    def __init__(self, app: App, events: EventLoop) -> None:
        self.app, self.events = app, events

    def _call(self, fn: Callable[..., Any], *args: Any) -> None:
        """``fn(*args)`` from a thread that is not the loop's: an ``async def`` on the loop."""
        if inspect.iscoroutinefunction(fn):
            self.events.run(fn(*args))
        else:
            fn(*args)

    def startup(self) -> None:
        """Every startup hook, in the order registered; ``HookFailed`` at the first that raises."""
        for fn in self.app.startup_hooks:
            try:
                self._call(fn)
            except Exception as exc:
                log.debug("on_startup hook %s raised", hook_name(fn), exc_info=True)
                raise HookFailed(f"on_startup hook {hook_name(fn)} raised {procs.one_line(exc)}") from exc

    def shutdown(self) -> None:
        """Every shutdown hook, in the order registered; one that raises is logged."""
        for fn in self.app.shutdown_hooks:
            try:
                self._call(fn)
            except Exception as exc:
                log.error("on_shutdown hook %s raised %s", hook_name(fn), procs.one_line(exc), exc_info=True)

    def failed(self, job: ClaimedJob, exc: BaseException) -> None:
        """The failure hooks of an attempt run on a thread (a sync or threaded handler's)."""
        view = job.to_job()
        for fn in self.app.failure_hooks:
            try:
                self._call(fn, view, exc)
            except Exception as error:
                _log_failed_hook(fn, job, error)

    async def failed_async(self, job: ClaimedJob, exc: BaseException) -> None:
        """The failure hooks of an attempt run on the loop (an async handler's)."""
        view = job.to_job()
        for fn in self.app.failure_hooks:
            try:
                if inspect.iscoroutinefunction(fn):
                    await fn(view, exc)
                else:
                    await asyncio.to_thread(fn, view, exc)
            except Exception as error:
                _log_failed_hook(fn, job, error)


def _log_failed_hook(fn: Callable[..., Any], job: ClaimedJob, error: Exception) -> None:
    log.error("on_failure hook %s raised %s (job %d attempt %d goes on)", hook_name(fn), procs.one_line(error),
              job.id, job.attempt, exc_info=error, extra=logs.job_fields(job))
