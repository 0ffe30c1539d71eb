"""The Django tasks backend: ``@task`` functions enqueued with ``.enqueue()`` become shardworker
jobs, and ``get_result()`` reads them back (docs/django.md).

A task is a job of kind ``task.module_path`` (``shop.tasks.send_receipt``) whose payload is
``{"args": [...], "kwargs": {...}}``; its id, as a string, is the ``TaskResult``'s. The job
is inserted on Django's own connection for the backend's database alias: inside
``transaction.atomic`` (or ``ATOMIC_REQUESTS``) it commits or rolls back with the request's
writes, and outside one it commits at once. ``get_result`` reads the row on Django's
connection inside a transaction of Django's (it sees what that transaction enqueued), else on
a connection of its own (the DSN of that alias, or ``OPTIONS["DSN"]``).

Mapping (Django → shardworker): ``queue_name`` → ``queue``; ``priority`` (-100..100, larger
first) → ``-priority`` (smaller first); ``run_after`` → ``run_at`` (a naive one in Django's
``TIME_ZONE`` when ``USE_TZ`` is off); ``OPTIONS["MAX_ATTEMPTS"]`` (default 1: Django's
backends run a task once) → ``max_attempts``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from shardworker.client import JobSpec, enqueue, using_schema
from shardworker.contrib.django.api import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from shardworker.core.config import check_schema
from shardworker.core.views import ErrorInfo, JobInfo
from shardworker.errors import ConfigError, EnqueueError
from shardworker.jobs import get_errors, get_job
from shardworker.queues import check_name

OPTIONS = ("DATABASE", "DSN", "MAX_ATTEMPTS", "THREADS", "TASK_MODULES", "SCHEMA")
STATUSES = {"waiting": "READY", "queued": "READY", "running": "RUNNING", "done": "SUCCESSFUL", "failed": "FAILED",
            "cancelled": "FAILED"}
# Keyword arguments of Django's connection that are not libpq's (``get_connection_params``).
NOT_LIBPQ = ("context", "cursor_factory", "prepare_threshold", "autocommit", "row_factory")


class Settings(NamedTuple):
    """A backend's ``OPTIONS``, checked."""

    database: str  # the Django database alias whose connection enqueues
    dsn: str | None  # a database of its own for the jobs: enqueues are then not in Django's transaction
    max_attempts: int
    threads: bool  # the worker runs sync tasks on its thread pool (threads=True handlers)
    task_modules: tuple[str, ...]  # modules holding tasks besides every installed app's ``tasks``
    schema: str | None = None  # the jobs' schema (docs/operating.md: several apps on one database)


def parse_options(alias: str, options: Any) -> Settings:
    """``TASKS[alias]["OPTIONS"]`` checked: ``ImproperlyConfigured`` with one line naming the
    option otherwise."""
    where = f"TASKS[{alias!r}]['OPTIONS']"
    if not isinstance(options, dict):
        raise ImproperlyConfigured(f"{where} must be a dict, got {type(options).__name__}")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ImproperlyConfigured(f"{where}: unknown option {unknown[0]!r} (expected one of {', '.join(OPTIONS)})")
    if "DATABASE" in options and "DSN" in options:
        raise ImproperlyConfigured(f"{where}: give DATABASE (enqueue in Django's transaction) or DSN (a database "
                                   "of the jobs' own), not both")
    database, dsn = options.get("DATABASE", "default"), options.get("DSN")
    if not isinstance(database, str) or database not in connections.settings:
        raise ImproperlyConfigured(f"{where}['DATABASE']: {database!r} is not an alias of settings.DATABASES")
    if dsn is not None and (not isinstance(dsn, str) or not dsn.strip()):
        raise ImproperlyConfigured(f"{where}['DSN'] must be a PostgreSQL DSN string, got {dsn!r}")
    attempts = options.get("MAX_ATTEMPTS", 1)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts < 2**31:
        raise ImproperlyConfigured(f"{where}['MAX_ATTEMPTS'] must be an integer from 1 to 2147483647, "
                                   f"got {attempts!r}")
    threads = options.get("THREADS", False)
    if not isinstance(threads, bool):
        raise ImproperlyConfigured(f"{where}['THREADS'] must be True or False, got {threads!r}")
    modules = options.get("TASK_MODULES", ())
    if isinstance(modules, str) or not isinstance(modules, list | tuple) or \
            not all(isinstance(m, str) and m for m in modules):
        raise ImproperlyConfigured(f"{where}['TASK_MODULES'] must be a list of module names, got {modules!r}")
    if dsn is None and connections[database].vendor != "postgresql":
        raise ImproperlyConfigured(f"{where}: database {database!r} is {connections[database].vendor}, "
                                   "not PostgreSQL (shardworker's jobs live in PostgreSQL)")
    schema = options.get("SCHEMA")
    if schema is not None:
        try:
            check_schema(schema)
        except ConfigError as exc:
            raise ImproperlyConfigured(f"{where}['SCHEMA']: {str(exc).partition(': ')[2]}") from None
    return Settings(database, dsn, attempts, threads, tuple(modules), schema)


class Backend(BaseTaskBackend):
    """``TASKS = {"default": {"BACKEND": "shardworker.contrib.django.Backend"}}``."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.settings = parse_options(alias, self.options)
        for name in sorted(self.queues):
            try:
                check_name(name)
            except ConfigError as exc:
                raise ImproperlyConfigured(f"TASKS[{alias!r}]['QUEUES']: {exc}") from None
        self._read_dsn: str | None = self.settings.dsn

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Insert the task's job (in Django's open transaction, if any); its ``TaskResult``, READY."""
        self.validate_task(task)
        check_discoverable(task.module_path, self.settings)
        payload = {"args": normalize_json(args), "kwargs": normalize_json(kwargs)}
        spec = {"queue": task.queue_name, "priority": -task.priority, "max_attempts": self.settings.max_attempts,
                "run_at": utc_run_at(task.run_after)}
        try:
            JobSpec(task.module_path, payload, **spec).payload_json()  # every refusal before anything is sent
        except EnqueueError as exc:
            raise InvalidTask(f"task {task.module_path}: {exc}") from None
        job_id = self.insert(task.module_path, payload, spec)
        result = TaskResult(task=task, id=str(job_id), status=TaskResultStatus.READY, enqueued_at=timezone.now(),
                            started_at=None, finished_at=None, last_attempted_at=None, args=payload["args"],
                            kwargs=payload["kwargs"], backend=self.alias, errors=[], worker_ids=[])
        task_enqueued.send(type(self), task_result=result)
        return result

    def insert(self, kind: str, payload: Any, spec: dict[str, Any]) -> int:
        """The job's id, inserted on Django's connection (or, with ``OPTIONS["DSN"]``, on one
        of its own to that database)."""
        if self.settings.dsn is not None:
            job_id = enqueue(self.settings.dsn, kind, payload, schema=self.settings.schema, **spec)
        else:
            conn = django_connection(self.settings.database)
            with transaction.mark_for_rollback_on_error(using=self.settings.database):
                job_id = enqueue(conn, kind, payload, schema=self.settings.schema, **spec)
        assert job_id is not None  # no dedupe_key: every enqueue inserts
        return job_id

    def get_result(self, result_id: str) -> Any:
        """The ``TaskResult`` of job ``result_id`` as its row reads now; ``TaskResultDoesNotExist``
        for an id with no job, or a job that is not one of this backend's tasks."""
        job_id = parse_id(result_id)
        source = self.read_source()
        with using_schema(self.settings.schema):
            job = get_job(source, job_id)
            if job is None:
                raise TaskResultDoesNotExist(f"no job {result_id}")
            task = task_at(job.kind, self.settings)
            if task is None or task.backend != self.alias:
                raise TaskResultDoesNotExist(f"job {job_id} ({job.kind}) is not a task of backend {self.alias!r}")
            errors = get_errors(source, job_id) if job.last_error is not None else []
        return result_of(job, errors, task, self.alias)

    def read_source(self) -> Any:
        """Where ``get_result`` reads: ``OPTIONS["DSN"]``; inside a transaction of Django's
        (``atomic()``, a ``TestCase``), Django's own connection, which sees the jobs that
        transaction enqueued; else a connection of its own to the alias's database (Django's
        connection outside a transaction would be left holding one)."""
        if self.settings.dsn is None and connections[self.settings.database].in_atomic_block:
            return django_connection(self.settings.database)
        if self._read_dsn is None:
            self._read_dsn = database_dsn(self.settings.database)
        return self._read_dsn


def django_connection(alias: str) -> Any:
    """The psycopg connection under Django's connection ``alias``, opened if need be, and in
    the transaction Django holds open: ``atomic()`` begins one only at its first statement,
    so when none has run yet one is run here (else the store would see no transaction open
    and commit the job on its own, whatever the block then does)."""
    wrapper = connections[alias]
    wrapper.validate_no_broken_transaction()  # a block an error has broken: Django's own one-line refusal
    wrapper.ensure_connection()
    conn = wrapper.connection  # psycopg 3's: Django prefers it to psycopg2, and shardworker requires it
    if not wrapper.get_autocommit() and conn.info.transaction_status.name == "IDLE":
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT 1")
    return conn


def database_dsn(alias: str = "default") -> str:
    """A libpq DSN (``key='value'`` pairs) for Django's database ``alias``, from its settings:
    what ``shardworker run --dsn`` and ``shardworker migrate --dsn`` take."""
    params = connections[alias].get_connection_params()
    pairs = [(key, value) for key, value in params.items()
             if key not in NOT_LIBPQ and isinstance(value, str | int) and not isinstance(value, bool)]
    return " ".join(f"{key}={quote_conninfo(str(value))}" for key, value in pairs)


def quote_conninfo(value: str) -> str:
    """A libpq connection-string value: single-quoted, with ``\\`` and ``'`` escaped."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def utc_run_at(run_after: dt.datetime | None) -> dt.datetime | None:
    """``run_after`` as an aware time: a naive one is in Django's ``TIME_ZONE`` (as Django reads
    it when ``USE_TZ`` is off), never UTC by default."""
    if run_after is None or timezone.is_aware(run_after):
        return run_after
    return timezone.make_aware(run_after, timezone.get_default_timezone())


def task_roots(settings: Settings) -> tuple[str, ...]:
    """Where tasks are found: every installed app's ``tasks`` module (and what is under it),
    and ``OPTIONS["TASK_MODULES"]``. The worker imports them all; a task elsewhere is refused
    at enqueue, since no worker would ever run it."""
    return (*(f"{config.name}.tasks" for config in apps.get_app_configs()), *settings.task_modules)


def is_discoverable(module_path: str, roots: tuple[str, ...]) -> bool:
    return any(module_path.startswith(f"{root}.") for root in roots)


def check_discoverable(module_path: str, settings: Settings) -> None:
    if not is_discoverable(module_path, task_roots(settings)):
        raise InvalidTask(f"task {module_path} is in no module the worker imports: define it in the tasks module "
                          "of an INSTALLED_APPS app, or list its module in OPTIONS['TASK_MODULES']")


def task_at(module_path: str, settings: Settings) -> Any:
    """The Task named ``module_path`` (a job's kind), or None when it names none of ours."""
    if not is_discoverable(module_path, task_roots(settings)):
        return None
    try:
        found = import_string(module_path)
    except ImportError:
        return None
    return found if isinstance(found, Task) else None


def parse_id(result_id: Any) -> int:
    text = str(result_id)
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise TaskResultDoesNotExist(f"no task result {result_id!r} (a result id is a job id: digits)")
    return int(text)


def result_of(job: JobInfo, errors: list[ErrorInfo], task: Any, alias: str) -> Any:
    """A job's row as a ``TaskResult`` (docs/django.md#results)."""
    payload = job.payload if isinstance(job.payload, dict) else {}
    attempts = max(job.attempt - job.snoozes, 0)
    started = job.attempted_at
    result = TaskResult(task=task_as_enqueued(task, job), id=str(job.id), status=TaskResultStatus(STATUSES[job.status]),
                        enqueued_at=job.created_at, started_at=started, finished_at=job.finished_at,
                        last_attempted_at=started, args=payload.get("args", []), kwargs=payload.get("kwargs", {}),
                        backend=alias, errors=[task_error(e) for e in errors], worker_ids=["shardworker"] * attempts)
    if job.status == "done":
        object.__setattr__(result, "_return_value", job.result)
    return result


def task_as_enqueued(task: Any, job: JobInfo) -> Any:
    """``task`` with the job's queue and priority (an operator may have changed them), when
    the backend still accepts them."""
    try:
        return task.using(queue_name=job.queue, priority=min(max(-job.priority, -100), 100))
    except InvalidTask:
        return task


def task_error(error: ErrorInfo) -> Any:
    """A failed attempt as Django's ``TaskError``: the exception's class from its traceback."""
    return TaskError(exception_class_path=exception_class_path(error.traceback, error.error),
                     traceback=error.traceback or error.error or "")


def exception_class_path(traceback: str | None, error: str | None) -> str:
    """``module.Class`` of the exception a traceback ends with (Python prints builtins bare:
    ``ValueError`` is ``builtins.ValueError``); from the error line (``Name: message``) when
    there is no traceback."""
    line = ""
    if traceback:
        tail = traceback.rpartition("Traceback (most recent call last):")[2]
        line = next((row for row in tail.splitlines() if row and not row[0].isspace()), "")
    if not line and error:
        line = error
    name = line.partition(":")[0].strip()
    if not name or " " in name:
        return "builtins.Exception"
    return name if "." in name else f"builtins.{name}"
