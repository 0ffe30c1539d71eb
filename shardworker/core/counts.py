"""The job counts ``shardworker stats`` and the dashboard show, made in one place so the two
agree: each queue's unfinished jobs split as the backlog splits them, then its finished ones.

``waiting`` (on dependencies, ``after=``) comes from ``PgStore.job_counts``; ``available``
(queued and due), ``scheduled`` (queued for later), ``prefetched`` (claimed by a
live worker, handler not started) and ``running`` (handler started) come from the backlog
(``PgStore.backlog``); ``done``, ``failed`` and ``cancelled`` from ``PgStore.job_counts``,
where ``done`` may be the planner's estimate on a big table. The status column's own
``queued`` and ``running`` (claimed) are not shown: each is a sum of two of the split.
"""

from __future__ import annotations

from collections.abc import Iterable

from shardworker.core.views import BacklogRow, UnservedKind

UNFINISHED = ("available", "scheduled", "prefetched", "running")
FINISHED = ("done", "failed", "cancelled")
SPLIT = ("waiting", *UNFINISHED, *FINISHED)


def split_by_queue(status_counts: Iterable[tuple[str, str, int]],
                   backlog: Iterable[BacklogRow]) -> dict[str, dict[str, int]]:
    """Each queue holding any job, by name: a count for every name in ``SPLIT``. Of the
    (queue, status, count) rows of ``status_counts`` only waiting and the finished statuses are
    read: the backlog splits the queued and claimed jobs."""
    queues: dict[str, dict[str, int]] = {}
    for row in backlog:
        counts = queues.setdefault(row.queue, dict.fromkeys(SPLIT, 0))
        for name, n in zip(UNFINISHED, (row.available, row.scheduled, row.prefetched, row.running), strict=True):
            counts[name] += n
    for queue, status, n in status_counts:
        if status in FINISHED or status == "waiting":
            queues.setdefault(queue, dict.fromkeys(SPLIT, 0))[status] += n
    return {queue: counts for queue, counts in sorted(queues.items()) if any(counts.values())}


def totals(queues: dict[str, dict[str, int]]) -> dict[str, int]:
    """Every queue's counts added up, for every name in ``SPLIT``."""
    return {name: sum(counts[name] for counts in queues.values()) for name in SPLIT}


def age_text(seconds: float) -> str:
    """An age in its largest whole unit up to days: 45s, 3m, 2h, 4d."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit == "m" else 1):
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def unserved_text(row: UnservedKind) -> str:
    """``kind (queue q): 3 queued, the oldest due 5m ago``: how the worker's log and ``doctor``
    name queued jobs of a kind no live worker serves."""
    due = f"due {age_text(row.waiting_s)} ago" if row.waiting_s >= 0 else f"not due for {age_text(-row.waiting_s)}"
    return f"{row.kind} (queue {row.queue}): {row.queued} queued, the oldest {due}"
