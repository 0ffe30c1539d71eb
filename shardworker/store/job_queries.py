"""Operators' reads and changes on jobs (``shardworker.jobs``, the dashboard): list, get,
their steps, wait for the end, retry, cancel, delete; and the jobs enqueued since a mark
(``shardworker.testing.record_enqueued``). Each takes the caller's psycopg
connection or a DSN (then opens a connection of its own and closes it) and returns
``JobInfo`` and ``StepInfo`` values.
The rules on which job may change how live in ``shardworker.jobs``; this module runs them
in one transaction under row locks."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import psycopg
from psycopg.pq import TransactionStatus

from shardworker.core.config import StoreConfig
from shardworker.core.views import ErrorInfo, JobInfo, LinkInfo, StepInfo
from shardworker.errors import DatabaseUnavailable, JobsError
from shardworker.store.connection import Session, translate_errors
from shardworker.store.enqueue import borrowed_cursor
from shardworker.store.sql import channel, current_schema, query

FINAL_STATUSES = ("done", "failed", "cancelled")
BULK_LIMIT = 100_000  # jobs one bulk change acts on (the next call takes the rest)


class KindCount(NamedTuple):
    queue: str
    kind: str
    status: str
    jobs: int


class MinuteCount(NamedTuple):
    minute: datetime
    done: int
    failed: int


@contextlib.contextmanager
def cursor_for(conn_or_dsn: Any, *, transaction: bool) -> Iterator[psycopg.Cursor[Any]]:
    """A cursor on the caller's connection (see ``borrowed_cursor``) or on a connection of
    its own to a DSN, opened and closed here."""
    if not isinstance(conn_or_dsn, str):
        with borrowed_cursor(conn_or_dsn, transaction=transaction) as cur:
            yield cur
        return
    session = Session(StoreConfig(dsn=conn_or_dsn))
    try:
        with session.cursor(transaction=transaction) as cur:
            yield cur
    finally:
        session.close()


class JobFilter(NamedTuple):
    """Which jobs: each given field narrows (None: any). ``tags``: jobs holding all of them;
    ``error``: a last error that contains it, whatever the case."""

    statuses: Sequence[str] | None = None
    kind: str | None = None
    queue: str | None = None
    key: str | None = None
    since: datetime | None = None
    tags: Sequence[str] | None = None
    error: str | None = None

    def params(self) -> dict[str, Any]:
        return {"statuses": list(self.statuses) if self.statuses else None, "kind": self.kind, "queue": self.queue,
                "key": self.key, "since": self.since, "tags": list(self.tags) if self.tags else None,
                "error": self.error}


def list_jobs(conn_or_dsn: Any, where: JobFilter, limit: int) -> list[JobInfo]:
    """Jobs newest first, filtered."""
    with cursor_for(conn_or_dsn, transaction=False) as cur:
        cur.execute(query("job_list"), {**where.params(), "limit": limit})
        return [JobInfo(*row) for row in cur.fetchall()]


def change_matching(conn_or_dsn: Any, action: str, where: JobFilter, allowed: Sequence[str], *,
                    dry_run: bool = False, reset_steps: bool = False, limit: int = BULK_LIMIT) -> int:
    """``retry``, ``cancel`` or ``delete`` the jobs ``where`` picks whose status the action
    allows, at most ``limit``, in one transaction as ``change_jobs`` does (a job locked by a
    claim or another change at that moment is left out; a delete leaves out the jobs live jobs
    wait on); how many. ``dry_run``: how many it would change, locking and changing none."""
    params = {**where.params(), "allowed": list(allowed), "limit": limit, "action": action}
    picked = query("job_ids_matching").rstrip().rstrip(";")
    if dry_run:
        with cursor_for(conn_or_dsn, transaction=False) as cur:
            cur.execute(f"SELECT count(*) FROM ({picked}) picked", params)
            row = cur.fetchone()
        return int(row[0]) if row else 0
    with cursor_for(conn_or_dsn, transaction=True) as cur:
        cur.execute(f"{picked} FOR UPDATE OF j SKIP LOCKED", params)
        ids = [int(r[0]) for r in cur.fetchall()]
        if not ids:
            return 0
        if action == "retry":
            cur.execute(query("job_dependencies_lock"), {"ids": ids})
        cur.execute(query(f"job_{action}"), {"ids": ids, "reset_steps": reset_steps})
        changed = cur.rowcount
        if action in ("cancel", "delete"):
            why = "was cancelled" if action == "cancel" else "was deleted"
            cur.execute(query("job_dependents_cancel"), {"ids": ids, "whys": [why] * len(ids)})
        return changed


def get_job(conn_or_dsn: Any, job_id: int) -> JobInfo | None:
    """One job, or None."""
    with cursor_for(conn_or_dsn, transaction=False) as cur:
        cur.execute(query("job_get"), {"id": job_id})
        row = cur.fetchone()
    return None if row is None else JobInfo(*row)


def get_errors(conn_or_dsn: Any, job_id: int) -> list[ErrorInfo]:
    """A job's failed attempts as its ``errors`` history keeps them, oldest first."""
    with cursor_for(conn_or_dsn, transaction=False) as cur:
        cur.execute(query("job_errors"), {"id": job_id})
        row = cur.fetchone()
    return [] if row is None else [ErrorInfo.of(entry) for entry in row[0]]


def last_job_id(conn_or_dsn: Any) -> int:
    """The last job id drawn so far by any session (0: none): later jobs have greater ids."""
    with cursor_for(conn_or_dsn, transaction=False) as cur:
        cur.execute(query("job_id_mark"))
        row = cur.fetchone()
    return int(row[0]) if row else 0


def jobs_after(conn_or_dsn: Any, after_id: int) -> list[JobInfo]:
    """Every job with an id above ``after_id``, in id order."""
    with cursor_for(conn_or_dsn, transaction=False) as cur:
        cur.execute(query("job_list_after"), {"after": after_id})
        return [JobInfo(*row) for row in cur.fetchall()]


def get_steps(conn_or_dsn: Any, job_id: int, limit: int | None) -> tuple[list[StepInfo], int]:
    """The first ``limit`` (None: all) of a job's recorded steps in recorded order, then name,
    and how many it holds in all."""
    with cursor_for(conn_or_dsn, transaction=False) as cur:
        cur.execute(query("job_steps_list"), {"id": job_id, "limit": limit})
        rows = cur.fetchall()
    return [StepInfo(name, attempt, at, size) for name, attempt, at, size, _ in rows], int(rows[0][4]) if rows else 0


def get_links(conn_or_dsn: Any, job_id: int) -> tuple[list[LinkInfo], list[LinkInfo]]:
    """The jobs ``job_id`` waits on and those waiting on it, by id."""
    with cursor_for(conn_or_dsn, transaction=False) as cur:
        cur.execute(query("job_dependency_links"), {"id": job_id})
        rows = cur.fetchall()
    return ([LinkInfo(i, k, s) for side, i, k, s, _ in rows if side == "dependency"],
            [LinkInfo(i, k, s) for side, i, k, s, _ in rows if side == "dependent"])


def other_schemas(conn_or_dsn: Any) -> list[str]:
    """The other schemas of this database that hold shardworker's jobs (``other_schemas``)."""
    with cursor_for(conn_or_dsn, transaction=False) as cur:
        cur.execute(query("other_schemas"), {"schema": current_schema()})
        return [str(row[0]) for row in cur.fetchall()]


def change_jobs(conn_or_dsn: Any, action: str, job_ids: Sequence[int],
                check: Callable[[dict[int, str]], Sequence[int]], done: Callable[[set[int]], None], *,
                reset_steps: bool = False) -> int:
    """Lock ``job_ids``, hand their statuses (the ones that exist) to ``check``, which
    raises to refuse or returns the ids to change, then run ``job_retry`` (forgetting the
    steps of the jobs it queues again when ``reset_steps``), ``job_cancel`` or ``job_delete``
    on those, and hand the ids it changed to ``done``, which may raise to roll it all back, in
    one transaction (a cancel or delete also cancels the jobs waiting on them); rows changed."""
    with cursor_for(conn_or_dsn, transaction=True) as cur:
        cur.execute(query("job_lock_for_change"), {"ids": list(job_ids)})
        job_ids = list(check({int(i): str(s) for i, s in cur.fetchall()}))
        if not job_ids:
            return 0
        if action == "retry":
            cur.execute(query("job_dependencies_lock"), {"ids": list(job_ids)})
        cur.execute(query(f"job_{action}"), {"ids": list(job_ids), "reset_steps": reset_steps})
        changed = {int(row[0]) for row in cur.fetchall()}
        done(changed)
        if action in ("cancel", "delete"):  # the jobs waiting on them can never run now
            why = "was cancelled" if action == "cancel" else "was deleted"
            cur.execute(query("job_dependents_cancel"), {"ids": list(job_ids), "whys": [why] * len(job_ids)})
        return len(changed)


def update_job(conn_or_dsn: Any, job_id: int, fields: dict[str, Any]) -> tuple[JobInfo | None, str | None]:
    """``job_update`` in one transaction: the job as changed, or None and its status (None:
    no such job) when it is not queued."""
    with cursor_for(conn_or_dsn, transaction=True) as cur:
        cur.execute(query("job_update"), {"id": job_id, **fields})
        row = cur.fetchone()
        if row is not None:
            cur.execute(query("notify_queue"), {"queue": row[2]})
            return JobInfo(*row), "queued"
        cur.execute(query("job_get"), {"id": job_id})
        found = cur.fetchone()
        if found is None:
            return None, None
        return None, str(found[3])


def retry_failed(conn_or_dsn: Any, kind: str | None, queue: str | None, *, reset_steps: bool = False) -> int:
    """Queue every failed job (of ``kind``, in ``queue``) again, in one transaction, forgetting
    their steps when ``reset_steps``; how many."""
    with cursor_for(conn_or_dsn, transaction=True) as cur:
        cur.execute(query("job_failed_ids"), {"kind": kind, "queue": queue})
        ids = [int(r[0]) for r in cur.fetchall()]
        if not ids:
            return 0
        cur.execute(query("job_dependencies_lock"), {"ids": ids})
        cur.execute(query("job_retry"), {"ids": ids, "reset_steps": reset_steps})
        return cur.rowcount


def wait_job_end(conn_or_dsn: Any, job_id: int, timeout_s: float,
                 on_progress: Callable[[Any], Any] | None = None) -> tuple[JobInfo | None, bool]:
    """The job once it is done, failed or cancelled (or gone), and True; or the job as it
    was when ``timeout_s`` ran out first, and False.

    It LISTENs on ``shardworker_finished`` before reading the row, so an end committed
    between the read and the wait still wakes it: a notification that arrives while a
    statement runs waits in psycopg's backlog for ``notifies()``. On the caller's connection
    (outside a transaction: notifications arrive only between transactions) each
    statement is committed at once when it is not in autocommit, and the subscription is
    undone before returning. With ``on_progress``, it reads the row every ``PROGRESS_RECHECK_S``
    and calls ``on_progress(value)`` with each new value the job reported (``job.progress``),
    the last one before it returns.
    """
    if not isinstance(conn_or_dsn, str):
        conn = idle_connection(conn_or_dsn)
        try:
            return _wait_on(conn, job_id, timeout_s, on_progress)
        finally:
            with contextlib.suppress(psycopg.Error):
                _run(conn, "unlisten_finished")
    session = Session(StoreConfig(dsn=conn_or_dsn))
    try:
        with translate_errors():
            return _wait_on(session.connection(), job_id, timeout_s, on_progress)
    finally:
        session.close()


RECHECK_S = 1.0  # wait_for reads the job again at least this often
PROGRESS_RECHECK_S = 0.25  # and this often when it reports progress


class ProgressSeen:
    """The progress values a wait has passed on: each new one once."""

    def __init__(self) -> None:
        self.last: Any = None

    def new(self, job: JobInfo | None) -> bool:
        if job is None or job.progress is None or job.progress == self.last:
            return False
        self.last = job.progress
        return True


def _wait_on(conn: psycopg.Connection[Any], job_id: int, timeout_s: float,
             on_progress: Callable[[Any], Any] | None = None) -> tuple[JobInfo | None, bool]:
    deadline = time.monotonic() + max(0.0, timeout_s)
    seen = ProgressSeen()
    with translate_errors():
        _run(conn, "listen_finished")
        while True:
            row = _run(conn, "job_get", {"id": job_id})
            job = None if row is None else JobInfo(*row)
            if on_progress is not None and seen.new(job):
                on_progress(seen.last)
            if job is None or job.status in FINAL_STATUSES:
                return job, True
            if time.monotonic() >= deadline:
                return job, False
            # Read the row again within RECHECK_S even without a notification: none comes
            # through a transaction pool (PgBouncer), where LISTEN cannot work.
            until = min(deadline, time.monotonic() + (RECHECK_S if on_progress is None else PROGRESS_RECHECK_S))
            while (remaining := until - time.monotonic()) > 0:
                if any(n.channel == channel("finished") and str(job_id) in n.payload.split(",")
                       for n in conn.notifies(timeout=remaining, stop_after=1)):
                    break


def _run(conn: psycopg.Connection[Any], name: str, params: dict[str, Any] | None = None) -> tuple[Any, ...] | None:
    """One statement, committed at once on a connection that is not in autocommit."""
    cur = conn.execute(query(name), params, prepare=False)  # see UnpreparedCursor
    row = cur.fetchone() if cur.description else None
    if not conn.autocommit:
        conn.commit()
    return row


def idle_connection(conn: Any) -> psycopg.Connection[Any]:
    """The caller's connection, checked to be open and outside a transaction."""
    if isinstance(conn, psycopg.AsyncConnection):
        raise JobsError("this is a psycopg.AsyncConnection: use `await shardworker.wait_for_async(aconn, job_id)`")
    if not isinstance(conn, psycopg.Connection):
        raise JobsError(f"expected a DSN string or an open psycopg connection, got {type(conn).__name__}")
    if conn.closed:
        raise DatabaseUnavailable("database unavailable: the connection is closed")
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise JobsError("wait_for needs a connection outside a transaction: PostgreSQL delivers "
                        "notifications only between transactions")
    return conn


# the dashboard: read-only, on a connection or a DSN ------------------------------------------

def dashboard_kind_counts(conn_or_dsn: Any) -> list[KindCount]:
    """(queue, kind, status, count) rows: every waiting, failed and cancelled job, and ``done_1h``
    for jobs done in the last hour (no statement reads the whole table)."""
    with cursor_for(conn_or_dsn, transaction=False) as cur:
        cur.execute(query("dashboard_kind_counts"))
        return [KindCount(str(q), str(k), str(s), int(n)) for q, k, s, n in cur.fetchall()]


def dashboard_finished_per_minute(conn_or_dsn: Any) -> list[MinuteCount]:
    """(minute, done, failed) for each of the last 60 minutes, oldest first, zeros included."""
    with cursor_for(conn_or_dsn, transaction=False) as cur:
        cur.execute(query("dashboard_finished_per_minute"))
        return [MinuteCount(m, int(d), int(f)) for m, d, f in cur.fetchall()]
