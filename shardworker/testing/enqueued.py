"""What a piece of code enqueued, read from the jobs table of a real PostgreSQL.

``record_enqueued(conn_or_dsn)`` notes the last job id drawn when the block starts and, when it
ends, reads every job with a greater id: the jobs enqueued meanwhile, by any means and any
session (ids come from one sequence), that were committed (or, on the caller's connection,
are in its open transaction). ``Enqueued`` holds them in id order and picks them by kind,
queue and payload.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from shardworker.core.views import JobInfo
from shardworker.store.job_queries import jobs_after, last_job_id

_ANY = object()


class Enqueued:
    """The jobs enqueued while ``record_enqueued``'s block ran (read when it ends; ``refresh``
    reads them now), in id order."""

    def __init__(self, conn_or_dsn: Any) -> None:
        self.conn_or_dsn = conn_or_dsn
        self.mark = last_job_id(conn_or_dsn)
        self.jobs: list[JobInfo] = []

    def refresh(self) -> None:
        self.jobs = jobs_after(self.conn_or_dsn, self.mark)

    def __iter__(self) -> Iterator[JobInfo]:
        return iter(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)

    @property
    def ids(self) -> list[int]:
        return [job.id for job in self.jobs]

    def kinds(self) -> list[str]:
        return [job.kind for job in self.jobs]

    def filter(self, *, kind: str | None = None, queue: str | None = None, payload: Any = _ANY,
               status: str | None = None) -> list[JobInfo]:
        """The jobs of ``kind``, in ``queue`` and ``status`` whose payload matches: a dict matches a
        payload that holds each of its keys with an equal value, a callable one it returns true
        for, anything else an equal payload."""
        return [job for job in self.jobs if (kind is None or job.kind == kind) and (queue is None or job.queue == queue)
                and (status is None or job.status == status) and _matches(job.payload, payload)]

    def one(self, *, kind: str | None = None, queue: str | None = None, payload: Any = _ANY,
            status: str | None = None) -> JobInfo:
        """The one job ``filter`` finds; ``AssertionError`` saying what it found otherwise."""
        found = self.filter(kind=kind, queue=queue, payload=payload, status=status)
        if len(found) == 1:
            return found[0]
        asked = {"kind": kind, "queue": queue, "status": status, "payload": None if payload is _ANY else payload}
        what = ", ".join(f"{name}={value!r}" for name, value in asked.items() if value is not None) or "anything"
        if not found:
            raise AssertionError(f"no job matches {what} among {len(self.jobs)} enqueued: "
                                 f"{', '.join(self.kinds()) or 'none'}")
        raise AssertionError(f"{len(found)} jobs match {what}: ids {[job.id for job in found]}")


def _matches(value: Any, wanted: Any) -> bool:
    if wanted is _ANY:
        return True
    if callable(wanted):
        return bool(wanted(value))
    if isinstance(wanted, dict):
        return isinstance(value, dict) and all(key in value and value[key] == v for key, v in wanted.items())
    return bool(value == wanted)


@contextlib.contextmanager
def record_enqueued(conn_or_dsn: Any) -> Iterator[Enqueued]:
    """Record the jobs enqueued while the block runs, on a DSN (committed jobs) or the caller's
    psycopg connection (also those in its open transaction)."""
    enqueued = Enqueued(conn_or_dsn)
    yield enqueued
    enqueued.refresh()


