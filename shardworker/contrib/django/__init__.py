"""Django's tasks framework on shardworker (``django.tasks`` in Django 6, the ``django_tasks``
backport on 5.2): ``Backend`` for ``settings.TASKS``, and ``app``, the worker's App of the
project's tasks, built when first asked for (``shardworker run --app
shardworker.contrib.django:app``), so that the web process, which imports ``Backend``,
never runs ``django.setup()`` from here. See docs/django.md.
"""

from __future__ import annotations

from typing import Any

from shardworker.contrib.django.backend import Backend, database_dsn

__all__ = ["Backend", "app", "database_dsn"]


def __getattr__(name: str) -> Any:
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from shardworker.contrib.django.worker import build_app

    built = build_app()
    globals()["app"] = built  # asked again (load_app asks twice): the same App
    return built
