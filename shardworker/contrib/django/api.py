"""The one place that knows where Django's tasks framework lives: ``django.tasks`` (Django 6)
or the ``django_tasks`` backport (Django 5.2 with ``pip install django-tasks``). Every other
module of ``shardworker.contrib.django`` takes the framework's names from here."""

from __future__ import annotations

from importlib import import_module
from types import ModuleType
from typing import Any


def _package() -> ModuleType:
    try:
        return import_module("django.tasks")
    except ImportError:
        return import_module("django_tasks")


package = _package()
PACKAGE: str = package.__name__
_base = import_module(f"{PACKAGE}.base")
_exceptions = import_module(f"{PACKAGE}.exceptions")
_signals = import_module(f"{PACKAGE}.signals")

BaseTaskBackend: Any = import_module(f"{PACKAGE}.backends.base").BaseTaskBackend
Task: Any = _base.Task
TaskContext: Any = _base.TaskContext
TaskError: Any = _base.TaskError
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
task_backends: Any = package.task_backends
# Django 6 names it InvalidTask; the backport, InvalidTaskError.
InvalidTask: type[Exception] = getattr(_exceptions, "InvalidTask", None) or _exceptions.InvalidTaskError
TaskResultDoesNotExist: type[Exception] = _exceptions.TaskResultDoesNotExist
task_enqueued: Any = _signals.task_enqueued
task_started: Any = _signals.task_started
task_finished: Any = _signals.task_finished
# Django 6 keeps it in django.utils.json; the backport, in django_tasks.utils.
normalize_json: Any = import_module("django.utils.json" if PACKAGE == "django.tasks" else f"{PACKAGE}.utils"
                                     ).normalize_json
