"""What the dashboard shows, gathered from PostgreSQL in plain values.

Each call opens one connection of its own (short timeouts: a dashboard must not hang on a
database that is away), runs its queries and closes it; ``shardworker.errors`` exceptions
(``DatabaseUnavailable``, ``SchemaMissing``...) reach the caller, which shows a banner.
These functions block: the web app runs them in its thread pool.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shardworker import jobs, queues
from shardworker.core import counts
from shardworker.core.views import (
    ErrorInfo,
    LimitUse,
    LinkInfo,
    QueueInfo,
    QueueState,
    StepInfo,
    UnservedKind,
    WorkerInfo,
)
from shardworker.errors import ConfigError, JobsError
from shardworker.jobs import JobInfo
from shardworker.store import job_queries, queue_queries
from shardworker.store.pg_store import PgStore, StoreConfig

FAILED_SHOWN = 20
RECENT_SHOWN = 15
LIVE_AFTER_S = 60.0  # as `shardworker workers --silent-after`: a heartbeat older than this is not live
KIND_COUNTS = ("waiting", *counts.UNFINISHED, "failed", "cancelled", "done_1h")
QUEUE_ACTIONS = ("pause", "resume", "limit", "clear")
# Up to this many rows (the planner's estimate) done is counted exactly, a scan of ~20 ms;
# above it, estimated as `stats` does past a million: an open page asks every 2 s.
EXACT_UP_TO = 100_000


@dataclass(frozen=True)
class Counts:
    """One row of a counts table: a queue (and kind) with a count per status."""

    queue: str
    kind: str | None
    by_status: dict[str, int]


@dataclass(frozen=True)
class QueueRow:
    """One queue on the overview: its state and backlog as ``shardworker queues`` lists it, and
    its counts as ``shardworker stats`` shows them (``counts.SPLIT``)."""

    info: QueueInfo
    counts: dict[str, int]


@dataclass(frozen=True)
class Minute:
    start: datetime
    done: int
    failed: int


@dataclass(frozen=True)
class Overview:
    queues: list[QueueRow]
    totals: dict[str, int]
    done_estimated: bool
    kinds: list[Counts]
    minutes: list[Minute]
    failed: list[JobInfo]
    recent: list[JobInfo]
    workers: list[WorkerInfo]
    unserved: list[UnservedKind]  # queued kinds no live worker serves in their queue
    limits: list[LimitUse]  # every limit across workers, with what uses it now
    waiting: list[JobInfo] = field(default_factory=list)  # sleeping, or waiting on an event or other jobs


@dataclass(frozen=True)
class Links:
    """One side of a job's links (the jobs it waits on, or those waiting on it): the first
    ``jobs.STEPS_SHOWN``, how many in all, and how many in each status ("deleted" for a job
    that is gone), so a fan-in of 10,000 reads as "9,990 done, 10 running" at a glance."""

    shown: list[LinkInfo]
    total: int
    by_status: dict[str, int]

    @classmethod
    def of(cls, links: list[LinkInfo]) -> Links:
        tally = Counter(link.status or "deleted" for link in links)
        return cls(links[:jobs.STEPS_SHOWN], len(links),
                   {status: tally[status] for status in (*jobs.STATUSES, "deleted") if tally[status]})


@dataclass(frozen=True)
class JobPage:
    """One job's page: the job, the first ``jobs.STEPS_SHOWN`` of its recorded steps, how
    many steps it holds in all, the jobs it waits on and those waiting on it, and its failed
    attempts (``jobs.get_errors``)."""

    job: JobInfo
    steps: list[StepInfo]
    steps_total: int
    dependencies: Links
    dependents: Links
    errors: list[ErrorInfo] = field(default_factory=list)  # its last failed attempts, oldest first


@contextlib.contextmanager
def connection(dsn: str) -> Iterator[tuple[Any, Any]]:
    """(store, its connection), opened here and closed on the way out."""
    store = PgStore(StoreConfig(dsn=dsn, connect_timeout_s=3, statement_timeout_s=10,
                                                  application_name="shardworker-dashboard"))
    try:
        yield store, store.connection()
    finally:
        store.close()


def overview(dsn: str) -> Overview:
    """Everything the front page shows, read on one connection."""
    with connection(dsn) as (store, conn):
        rows, estimated = store.job_counts(exact_up_to=EXACT_UP_TO)
        backlog = store.backlog()
        states = store.queue_states()
        kind_rows = job_queries.dashboard_kind_counts(conn)
        minutes = [Minute(*m) for m in job_queries.dashboard_finished_per_minute(conn)]
        failed = jobs.list_jobs(conn, status="failed", limit=FAILED_SHOWN)
        recent = jobs.list_jobs(conn, limit=RECENT_SHOWN)
        waiting = jobs.list_jobs(conn, status="waiting", limit=FAILED_SHOWN)
        # The live, and the silent whose running jobs still hold slots (until a rescue or `workers forget`).
        workers = [w for w in store.workers() if w.silent_s <= LIVE_AFTER_S or w.slots]
        unserved = store.unserved_kinds()
        limits = store.limits()
    split = counts.split_by_queue(rows, backlog)
    infos = {info.name: info for info in queue_queries.summarize(states, backlog)}
    queue_rows = [QueueRow(infos.get(name) or QueueInfo(name, False, None, None, 0, 0, 0, 0, None),
                           split.get(name) or dict.fromkeys(counts.SPLIT, 0))
                  for name in sorted(split.keys() | infos.keys())]
    kind_backlog = ((b.queue, b.kind, name, n) for b in backlog if b.kind is not None
                    for name, n in zip(counts.UNFINISHED, (b.available, b.scheduled, b.prefetched, b.running),
                                       strict=True))
    kinds = _group([*kind_backlog, *kind_rows], KIND_COUNTS)
    return Overview(queue_rows, counts.totals(split), estimated, kinds, minutes, failed, recent, workers, unserved,
                    limits, waiting)


def job(dsn: str, job_id: int) -> JobPage | None:
    """What a job's page shows, read on one connection; None when no job has that id."""
    with connection(dsn) as (_, conn):
        found = jobs.get_job(conn, job_id)
        if found is None:
            return None
        steps, total = jobs.first_steps(conn, job_id, jobs.STEPS_SHOWN)
        dependencies, dependents = jobs.get_links(conn, job_id)
        errors = jobs.get_errors(conn, job_id)
    return JobPage(found, steps, total, Links.of(dependencies), Links.of(dependents), errors)


SEARCH_SHOWN = 100
SEARCH_FIELDS = ("status", "kind", "queue", "key", "tag", "error", "since")


@dataclass(frozen=True)
class Search:
    """A search's jobs (the newest ``SEARCH_SHOWN``) and how many each bulk button would change."""

    jobs: list[JobInfo]
    would: dict[str, int]  # action -> jobs it would change (a dry run)


def search_filters(fields: dict[str, str]) -> dict[str, Any]:
    """The ``jobs`` filters of a search form's fields (empty ones left out; ``tag``: comma-separated,
    all of them; ``since``: 30m, 2h, 7d or an ISO 8601 time); ``JobsError`` for a bad one."""
    given = {name: fields.get(name, "").strip() for name in SEARCH_FIELDS}
    if given["status"] and given["status"] not in jobs.STATUSES:
        raise jobs.JobsError(f"no status {given['status']!r}; one of {', '.join(jobs.STATUSES)}")
    return {"status": given["status"] or None, "kind": given["kind"] or None, "queue": given["queue"] or None,
            "key": given["key"] or None,
            "tag": [t.strip() for t in given["tag"].split(",") if t.strip()] or None,
            "error_contains": given["error"] or None, "since": jobs.parse_since(given["since"] or None, "since")}


def search(dsn: str, fields: dict[str, str]) -> Search:
    """The jobs a search form picks, and what its bulk buttons would change."""
    filters = search_filters(fields)
    with connection(dsn) as (_, conn):
        found = jobs.list_jobs(conn, limit=SEARCH_SHOWN, **filters)
        would = {} if not any(v is not None for v in filters.values()) else {
            action: getattr(jobs, f"{action}_matching")(conn, **filters, dry_run=True)
            for action in ("retry", "cancel", "delete")}
    return Search(found, would)


def bulk(dsn: str, action: str, fields: dict[str, str]) -> int:
    """A search's bulk button: ``retry``, ``cancel`` or ``delete`` every job it picks; how many."""
    with connection(dsn) as (_, conn):
        return int(getattr(jobs, f"{action}_matching")(conn, **search_filters(fields)))


def change(dsn: str, action: str, job_id: int) -> int:
    """``retry``, ``cancel`` or ``wake`` one job (``JobsError`` says why not); how many changed."""
    with connection(dsn) as (_, conn):
        return int({"retry": jobs.retry, "cancel": jobs.cancel, "wake": jobs.wake}[action](conn, [job_id]))


def change_queue(dsn: str, action: str, name: str, concurrency: str, rate: str) -> QueueState:
    """A queue's button, through ``shardworker.queues``: ``pause``, ``resume``, ``limit`` (the
    concurrency and rate typed; an empty one stays as it is) or ``clear``. Bad input is a
    ``JobsError`` saying why, and nothing is written."""
    with connection(dsn) as (_, conn):
        try:
            if action == "limit":
                return queues.limit(conn, name, concurrency=_concurrency(concurrency.strip()),
                                    rate=rate.strip() or None)
            if action == "clear":
                return queues.limit(conn, name, clear=True)
            return queues.pause(conn, name) if action == "pause" else queues.resume(conn, name)
        except ConfigError as exc:
            raise JobsError(str(exc)) from exc


def _concurrency(text: str) -> int | None:
    """The concurrency typed: None when nothing is; a ``ConfigError`` in ``shardworker.queues``'
    own words when it is no whole number in range."""
    if not text:
        return None
    return queues.check_concurrency(int(text) if text.isascii() and text.isdigit() and len(text) <= 12 else text)


def _group(rows: Any, statuses: tuple[str, ...]) -> list[Counts]:
    grouped: dict[tuple[str, str | None], dict[str, int]] = {}
    for queue, kind, status, n in rows:
        grouped.setdefault((queue, kind), dict.fromkeys(statuses, 0))[status] = n
    ordered = sorted(grouped.items(), key=lambda item: (item[0][0], item[0][1] or ""))
    return [Counts(queue, kind, counts) for (queue, kind), counts in ordered]
