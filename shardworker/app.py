"""The handler API: ``App`` registers handlers by kind.

::

    app = App()

    @app.handler("thumbnail", max_attempts=5, timeout_s=30)
    def thumbnail(job: Job) -> dict:            # CPU work: one at a time per child
        return {"bytes": 123}

    @app.handler("fetch", timeout_s=10)
    async def fetch(job: Job) -> dict:          # awaits I/O: up to --concurrency per child
        ...

    @app.handler("upload", threads=True, concurrency=4)
    def upload(job: Job) -> None:               # blocking I/O: a thread pool; at most 4 per worker
        ...

    @app.handler("call_api", global_concurrency=50, rate="10/s")
    async def call_api(job: Job) -> None:       # at most 50 at once and 10 starts a second, across workers
        ...

    @app.periodic("*/5 * * * *", kind="report", payload={"scope": "all"})
    def report(job: Job) -> None:               # enqueued every 5 minutes, once across workers
        ...

A handler returns any JSON-serializable value (stored in ``jobs.result``) or raises to
fail the attempt. ``retry_delay`` maps an attempt number to seconds before the retry.

Hooks, each sync or ``async def`` and run in every child process (``shardworker.child.hooks``)::

    @app.on_startup
    async def open_client() -> None:            # before the child's first job, on its event loop
        app.state.http = httpx.AsyncClient()    # what handlers share: app.state, one per process

    @app.on_shutdown
    async def close_client() -> None:           # after its last job
        await app.state.http.aclose()

    @app.on_failure
    def report(job: Job, exc: BaseException) -> None:   # each failed attempt, in the child
        sentry_sdk.capture_exception(exc)

This module loads the app; it runs nothing (``shardworker.child.handlers`` does).
"""

from __future__ import annotations

import copy
import importlib
import inspect
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

from shardworker.core.flow import Rate, parse_rate
from shardworker.core.limits import (
    DEFAULT_MAX_ATTEMPTS,
    MAX_DELAY_S,
    MAX_KIND_BYTES,
    MAX_PERIODIC_NAME_BYTES,
    MAX_QUEUE_BYTES,
    not_storable_text,
    too_long,
    unservable_queue_name,
)
from shardworker.core.model import Job
from shardworker.core.retry import job_retry_delay
from shardworker.core.schedule import DEFAULT_CATCH_UP, Schedule
from shardworker.errors import AppLoadError, ConfigError

Handler = Callable[[Job], Any]
Hook = Callable[[], Any]  # on_startup, on_shutdown: sync, or async def
FailureHook = Callable[[Job, BaseException], Any]  # on_failure: sync, or async def


@dataclass(frozen=True)
class HandlerSpec:
    """One registered handler and its per-kind policy."""

    kind: str
    fn: Handler
    # Lowers its jobs' max_attempts at their first claim (the row then decides); None: as enqueued.
    max_attempts: int | None = None
    timeout_s: float | None = None
    retry_delay: Callable[[int], float] = job_retry_delay
    threads: bool = False  # a sync handler run on the child's thread pool
    concurrency: int | None = None  # at most this many in flight per worker
    global_concurrency: int | None = None  # at most this many running across every worker
    rate: Rate | None = None  # at most rate.n starting per rate.period_s across every worker
    key_concurrency: int | None = None  # at most this many of one key (enqueue's key=) running across every worker

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    @property
    def lane(self) -> str:
        """Where a child runs it: ``async`` (event loop), ``threads`` (pool) or ``sync`` (one at a time)."""
        return "async" if self.is_async else "threads" if self.threads else "sync"

    def delay_after_failure(self, attempt: int) -> float | None:
        """Seconds before retrying a failed ``attempt``, or None when its ``retry_delay`` said
        never (negative or infinite); whether attempts remain is the job row's to say (its
        max_attempts, which the first claim set from this handler's). A ``retry_delay``
        that raises or returns NaN falls back to the default backoff."""
        try:
            delay = float(self.retry_delay(attempt))
        except Exception:
            return job_retry_delay(attempt)
        if math.isnan(delay):
            return job_retry_delay(attempt)
        if delay < 0 or math.isinf(delay):
            return None
        return min(delay, MAX_DELAY_S)


class App:
    """A set of handlers, looked up by job kind."""

    def __init__(self) -> None:
        self.handlers: dict[str, HandlerSpec] = {}
        self.schedules: dict[str, Schedule] = {}
        self.startup_hooks: list[Hook] = []
        self.shutdown_hooks: list[Hook] = []
        self.failure_hooks: list[FailureHook] = []
        # What the startup hooks make for the handlers (a client, a pool): one per process.
        self.state = SimpleNamespace()
        # The database of this app's jobs when `run` is given no --dsn (nor SHARDWORKER_DSN),
        # instead of the embedded server: set by an integration that knows it (the Django
        # backend's app: Django's own database).
        self.dsn: str | None = None

    def on_startup(self, fn: Hook) -> Hook:
        """Run ``fn()`` in each child before its first job (an ``async def`` on the child's
        event loop, where async handlers run); a hook that raises stops the worker at start."""
        return _add_hook(self.startup_hooks, "on_startup", fn)

    def on_shutdown(self, fn: Hook) -> Hook:
        """Run ``fn()`` in each child after its last job, when it stops; an error is logged."""
        return _add_hook(self.shutdown_hooks, "on_shutdown", fn)

    def on_failure(self, fn: FailureHook) -> FailureHook:
        """Call ``fn(job, exc)`` in the child for each failed attempt, the exception that failed
        it in hand (``docs/handlers.md``); an error it raises is logged, never fatal."""
        return _add_hook(self.failure_hooks, "on_failure", fn)

    def periodic(self, cron: str, *, kind: str, payload: Any = None, name: str | None = None,
                 queue: str = "default", priority: int = 0, max_attempts: int = DEFAULT_MAX_ATTEMPTS, tz: str = "UTC",
                 catch_up: int = DEFAULT_CATCH_UP, **handler_options: Any) -> Callable[[Handler], Handler]:
        """Enqueue a ``kind`` job with ``payload`` at every tick of ``cron`` (see
        ``shardworker.periodic``). Registered at once; used as a decorator it also registers
        the function as the handler of ``kind`` (with ``handler_options``)."""
        _check_sizes("a periodic job's", (("kind", kind, MAX_KIND_BYTES), ("queue", queue, MAX_QUEUE_BYTES),
                                          ("name", name, MAX_PERIODIC_NAME_BYTES)))
        if why := isinstance(queue, str) and unservable_queue_name(queue):
            raise ConfigError(f"a periodic job's {why}")
        schedule = Schedule(cron, kind, Schedule.encode_payload(kind, payload), name or "", queue, priority,
                            max_attempts, tz, catch_up)
        if schedule.name in self.schedules:
            raise ConfigError(f"periodic {schedule.name!r} is scheduled twice; give each a distinct name=")
        self.schedules[schedule.name] = schedule
        return self.handler(kind, **handler_options)

    def handler(self, kind: str, *, max_attempts: int | None = None, timeout_s: float | None = None,
                retry_delay: Callable[[int], float] | None = None, threads: bool = False,
                concurrency: int | None = None, global_concurrency: int | None = None,
                rate: str | None = None, key_concurrency: int | None = None) -> Callable[[Handler], Handler]:
        """Register the decorated function (sync or ``async def``) as the handler of ``kind``.

        ``concurrency`` caps the kind within one worker; ``global_concurrency`` and ``rate``
        (``"N/s"``, ``"N/m"``, ``"N/h"``) across every worker on the database
        (``shardworker.core.flow``); ``key_concurrency`` the jobs of one key (a tenant's:
        ``enqueue(..., key=)``) running at once across every worker, while other keys' run."""
        if not isinstance(kind, str) or not kind:
            raise ConfigError("a handler's kind must be a non-empty string")
        _check_sizes("a handler's", (("kind", kind, MAX_KIND_BYTES),))
        if max_attempts is not None and max_attempts < 1:
            raise ConfigError(f"handler {kind!r}: max_attempts must be >= 1")
        if timeout_s is not None and not 0 < timeout_s < float("inf"):
            raise ConfigError(f"handler {kind!r}: timeout_s must be a positive number of seconds")
        if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 1):
            raise ConfigError(f"handler {kind!r}: concurrency must be an integer >= 1")
        if global_concurrency is not None and (not isinstance(global_concurrency, int) or global_concurrency < 1):
            raise ConfigError(f"handler {kind!r}: global_concurrency must be an integer >= 1")
        if key_concurrency is not None and (not isinstance(key_concurrency, int) or isinstance(key_concurrency, bool)
                                            or key_concurrency < 1):
            raise ConfigError(f"handler {kind!r}: key_concurrency must be an integer >= 1")
        try:
            parsed_rate = parse_rate(rate) if rate is not None else None
        except ConfigError as exc:
            raise ConfigError(f"handler {kind!r}: {exc}") from None

        def register(fn: Handler) -> Handler:
            if kind in self.handlers:
                raise ConfigError(f"handler {kind!r} is registered twice")
            if threads and inspect.iscoroutinefunction(fn):
                raise ConfigError(f"handler {kind!r}: threads=True is for sync functions; an async def "
                                  "already runs concurrently on the event loop")
            self.handlers[kind] = HandlerSpec(kind, fn, max_attempts, timeout_s, retry_delay or job_retry_delay,
                                              threads, concurrency, global_concurrency, parsed_rate, key_concurrency)
            return fn

        return register

    @property
    def kinds(self) -> list[str]:
        return sorted(self.handlers)

    def with_default_timeout(self, timeout_s: float | None) -> App:
        """A copy in which every handler without its own ``timeout_s`` has ``timeout_s``
        (``None`` or 0: no limit, the app itself)."""
        if not timeout_s:
            return self
        app = copy.copy(self)  # the same hooks, and the same state
        app.handlers = {kind: spec if spec.timeout_s is not None else replace(spec, timeout_s=timeout_s)
                        for kind, spec in self.handlers.items()}
        return app


def _add_hook(hooks: list[Any], what: str, fn: Any) -> Any:
    if not callable(fn):
        raise ConfigError(f"app.{what} takes a function, not a {type(fn).__name__}")
    hooks.append(fn)
    return fn


def hook_name(fn: Any) -> str:
    """``module.name`` of a hook, for the line that names it."""
    return f"{getattr(fn, '__module__', None) or '?'}.{getattr(fn, '__qualname__', None) or repr(fn)}"


def _check_sizes(whose: str, fields: tuple[tuple[str, Any, int], ...]) -> None:
    """Refuse a name the database could not index (``shardworker.core.limits``) at registration,
    not when its first job is written."""
    for name, value, limit in fields:
        why = (too_long(f"{whose} {name}", value, limit) or not_storable_text(f"{whose} {name}", value)
               if isinstance(value, str) else None)
        if why:
            raise ConfigError(why)


def _no_attribute(module_name: str, module: Any, attr: str, cwd: str) -> str:
    """Why ``module`` has no App at ``attr``: a folder of data, an installed module that
    shadows the project's own of that name, or just no such attribute."""
    where = getattr(module, "__file__", None)
    if where is None:  # a namespace package: a folder without __init__.py
        folder = next(iter(getattr(module, "__path__", [])), module_name)
        return f"--app {module_name}: {folder} is a folder without Python code, not a module (--app MODULE[:ATTR])"
    local = os.path.join(cwd, module_name.split(".")[0])
    ours = local + ".py" if os.path.exists(local + ".py") else local + os.sep if os.path.isdir(local) else None
    if ours is not None and not os.path.abspath(where).startswith(cwd + os.sep):
        return (f"--app {module_name} loaded {where}, not the project's {os.path.relpath(ours)}: an installed "
                "module of that name comes first; rename the project's module")
    return f"module {module_name!r} has no attribute {attr!r} (--app MODULE[:ATTR]; ATTR defaults to app)"


def load_app(ref: str) -> App:
    """Import ``module[:attr]`` (attr defaults to ``app``) and return the App it names."""
    module_name, _, attr = ref.partition(":")
    if not module_name:
        raise AppLoadError(f"--app {ref!r}: expected MODULE[:ATTR]")
    if module_name.endswith(".py") or os.sep in module_name:
        dotted = module_name.removesuffix(".py").strip(os.sep).replace(os.sep, ".")
        raise AppLoadError(f"--app {ref!r} is a path; give the module, as Python imports it: "
                           f"--app {dotted}{':' + attr if attr else ''}")
    # Modules in the working directory load (like `python -m`), but after the installed
    # packages: a project folder named `outbox/` must not shadow shardworker's own.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise AppLoadError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    if not hasattr(module, attr or "app"):
        raise AppLoadError(_no_attribute(module_name, module, attr or "app", cwd))
    app = getattr(module, attr or "app")
    if not isinstance(app, App):
        raise AppLoadError(f"{module_name}:{attr or 'app'} is a {type(app).__name__}, not a shardworker App")
    if not app.handlers:
        raise AppLoadError(f"{ref}: the App has no handlers")
    return app
