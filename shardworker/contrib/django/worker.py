"""The worker side: a shardworker ``App`` that runs the tasks of every
``shardworker.contrib.django.Backend`` in ``settings.TASKS``.

``build_app()`` runs ``django.setup()`` (``DJANGO_SETTINGS_MODULE`` names the settings),
imports every installed app's ``tasks`` module (a package with all its submodules) and the
backends' ``OPTIONS["TASK_MODULES"]``, and registers one handler per task found, its kind the
task's ``module_path``: so limits, ``jobs list --kind`` and the dashboard are per task, and
the worker claims exactly the tasks it can run. It runs in the worker's parent, before the
children are forked, and leaves no database connection open for them to share.

Each run is wrapped as Django wraps a request: ``reset_queries()`` and
``close_old_connections()`` before it, ``close_old_connections()`` after it (a connection
past ``CONN_MAX_AGE``, or one an error left unusable, is closed; with the default
``CONN_MAX_AGE = 0`` every connection the task opened). An ``async def`` task runs in a
``ThreadSensitiveContext`` of its own, as an ASGI request does: its ORM calls
(``sync_to_async``) use a thread, and connections, no other running task shares.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from typing import Any

from shardworker.app import App, Handler
from shardworker.contrib.django.api import TaskContext, TaskError, TaskResult, TaskResultStatus, normalize_json
from shardworker.contrib.django.api import task_finished as finished_signal
from shardworker.contrib.django.api import task_started as started_signal
from shardworker.contrib.django.backend import Backend, database_dsn, is_discoverable, task_roots
from shardworker.core.model import Job
from shardworker.errors import AppLoadError

SETTINGS_ENV = "DJANGO_SETTINGS_MODULE"


def build_app() -> App:
    """The App of the project's Django tasks; ``AppLoadError`` with one line saying what is missing."""
    if not os.environ.get(SETTINGS_ENV):
        raise AppLoadError(f"shardworker.contrib.django:app needs {SETTINGS_ENV} (the Django project's settings "
                           "module, importable from PYTHONPATH or the working directory)")
    import django
    from django.db import connections

    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)  # as `--app` loads a module of the working directory, so the project loads
    try:
        django.setup()
    except Exception as exc:
        raise AppLoadError(f"django.setup() with {SETTINGS_ENV}={os.environ[SETTINGS_ENV]}: "
                           f"{type(exc).__name__}: {exc}") from exc
    backends = our_backends()
    if not backends:
        raise AppLoadError("settings.TASKS names no shardworker.contrib.django.Backend")
    tasks = discover(backends)
    if not tasks:
        raise AppLoadError(f"no task of backend(s) {', '.join(sorted(backends))} found: define them in the tasks "
                           "module of an INSTALLED_APPS app, or list their modules in OPTIONS['TASK_MODULES']")
    from shardworker.store.sql import current_schema

    for alias, backend in sorted(backends.items()):
        wanted = backend.settings.schema
        if wanted is not None and wanted != current_schema():
            raise AppLoadError(f"TASKS[{alias!r}]['OPTIONS']['SCHEMA'] is {wanted}, this worker's schema is "
                               f"{current_schema()}: run it with --schema {wanted} (or SHARDWORKER_SCHEMA)")
    app = App()
    for path, task in sorted(tasks.items()):
        backend = backends[task.backend]
        run = async_handler(task, type(backend)) if task_is_async(task) else sync_handler(task, type(backend))
        app.handler(path, threads=backend.settings.threads and not task_is_async(task))(run)
    # Where the jobs are when `run` is given no --dsn: the backends' database, when they agree
    # (else the embedded server would be used, which holds none of the project's jobs).
    databases = {backend.settings.dsn or database_dsn(backend.settings.database) for backend in backends.values()}
    if len(databases) == 1:
        app.dsn = databases.pop()
    connections.close_all()  # the children are forked from this process: none may inherit a connection
    return app


def our_backends() -> dict[str, Backend]:
    """The backends of ``settings.TASKS`` that are this module's ``Backend``, by alias."""
    from django.conf import settings

    from shardworker.contrib.django.api import task_backends

    found = {}
    for alias in getattr(settings, "TASKS", {}):
        backend = task_backends[alias]  # a subclass of Backend counts too
        if isinstance(backend, Backend):
            found[alias] = backend
    return found


def discover(backends: dict[str, Backend]) -> dict[str, Any]:
    """Every task of ``backends`` in the modules they find tasks in, by module path."""
    roots = sorted({root for backend in backends.values() for root in task_roots(backend.settings)})
    for root in roots:
        import_tree(root, required=not root.endswith(".tasks") or is_listed(root, backends))
    from shardworker.contrib.django.api import Task

    tasks: dict[str, Any] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not any(name == root or name.startswith(f"{root}.") for root in roots):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, Task) and value.backend in backends and \
                    is_discoverable(value.module_path, task_roots(backends[value.backend].settings)):
                tasks.setdefault(value.module_path, value)
    return tasks


def is_listed(root: str, backends: dict[str, Backend]) -> bool:
    return any(root in backend.settings.task_modules for backend in backends.values())


def import_tree(name: str, *, required: bool) -> None:
    """Import module ``name`` and, for a package, every module under it. An app without a
    ``tasks`` module is skipped; a listed module that cannot be imported stops the worker."""
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if not required and exc.name is not None and name.startswith(exc.name):
            return  # the app has no tasks module (its own imports failing is an error, below)
        raise AppLoadError(f"cannot import {name!r}: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        raise AppLoadError(f"cannot import {name!r}: {type(exc).__name__}: {exc}") from exc
    for info in pkgutil.walk_packages(getattr(module, "__path__", []), prefix=f"{name}."):
        import_tree(info.name, required=True)


def task_is_async(task: Any) -> bool:
    import inspect

    return inspect.iscoroutinefunction(task.func)


def arguments(job: Job) -> tuple[list[Any], dict[str, Any]]:
    payload = job.payload if isinstance(job.payload, dict) else {}
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise TypeError(f"job {job.id}'s payload is not a Django task's ({{'args': [...], 'kwargs': {{...}}}})")
    return args, kwargs


def running_result(task: Any, job: Job, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """The ``TaskResult`` a running task sees (``takes_context``) and the signals carry."""
    from django.utils import timezone

    now = timezone.now()
    return TaskResult(task=task, id=str(job.id), status=TaskResultStatus.RUNNING, enqueued_at=None,
                      started_at=now, finished_at=None, last_attempted_at=now, args=args, kwargs=kwargs,
                      backend=task.backend, errors=[], worker_ids=["shardworker"] * (job.attempt - job.snoozes))


def call_args(task: Any, result: Any, args: list[Any]) -> list[Any]:
    return [TaskContext(task_result=result), *args] if task.takes_context else args


def finish(result: Any, sender: type, value: Any = None, error: BaseException | None = None) -> Any:
    """Send ``task_finished`` for ``result`` ended with ``value`` or ``error``; the value as JSON holds it."""
    from django.utils import timezone

    object.__setattr__(result, "finished_at", timezone.now())
    if error is None:
        value = normalize_json(value)
        object.__setattr__(result, "_return_value", value)
        object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    else:
        import traceback

        result.errors.append(TaskError(exception_class_path=f"{type(error).__module__}.{type(error).__qualname__}",
                                       traceback="".join(traceback.format_exception(error))))
        object.__setattr__(result, "status", TaskResultStatus.FAILED)
    finished_signal.send(sender, task_result=result)
    return value


def sync_handler(task: Any, sender: type) -> Handler:
    """A handler that runs a sync task between Django's connection checks."""
    from django.db import close_old_connections, reset_queries

    def run(job: Job) -> Any:
        args, kwargs = arguments(job)
        reset_queries()
        close_old_connections()
        try:
            result = running_result(task, job, args, kwargs)
            started_signal.send(sender, task_result=result)
            try:
                value = task.func(*call_args(task, result, args), **kwargs)
            except Exception as exc:
                finish(result, sender, error=exc)
                raise
            return finish(result, sender, value)
        finally:
            close_old_connections()

    return run


def async_handler(task: Any, sender: type) -> Handler:
    """A handler that awaits an ``async def`` task in a thread-sensitive context of its own.
    That context's thread is new for each task, so the connections the task opened there are
    closed at its end, whatever ``CONN_MAX_AGE`` says (no later task could reuse them)."""
    from asgiref.sync import ThreadSensitiveContext, sync_to_async
    from django.db import close_old_connections, connections, reset_queries

    async def run(job: Job) -> Any:
        args, kwargs = arguments(job)
        async with ThreadSensitiveContext():
            await sync_to_async(reset_queries)()
            await sync_to_async(close_old_connections)()
            try:
                result = running_result(task, job, args, kwargs)
                await sync_to_async(started_signal.send)(sender, task_result=result)
                try:
                    value = await task.func(*call_args(task, result, args), **kwargs)
                except Exception as exc:
                    await sync_to_async(finish)(result, sender, error=exc)
                    raise
                return await sync_to_async(finish)(result, sender, value)
            finally:
                await sync_to_async(connections.close_all)()

    return run
