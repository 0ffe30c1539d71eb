"""Not a tasks module: a task defined here is one no worker imports, so enqueueing it is refused."""

from __future__ import annotations

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task
def stray() -> None:
    pass
