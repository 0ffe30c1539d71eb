"""Enqueue on a connection of the store's own or one the caller lends: one job with an
INSERT, many with COPY, in the caller's transaction when one is open.
``shardworker.client`` validates; this module only writes."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg import errors as pgerr
from psycopg.pq import TransactionStatus
from psycopg.types.json import JsonbLoader, JsonLoader

from shardworker.core.config import StoreConfig
from shardworker.errors import DatabaseUnavailable, EnqueueError
from shardworker.store.connection import Session, UnpreparedCursor, first_line, translate_errors
from shardworker.store.sql import query

log = logging.getLogger(__name__)

# Bulk loads may take minutes: a connection of our own for COPY has no 30 s statement timeout.
BULK_STATEMENT_TIMEOUT_S = 3600.0
REFUSED = (psycopg.DataError, psycopg.IntegrityError, pgerr.ProgramLimitExceeded)
# A staged row's fields (job_stage_copy): kind, queue, payload, priority, max_attempts, run_at,
# dedupe_key, key, tags, trace; a row without the last ones (no key, no tags, no trace) is padded.
ROW_FIELDS = 10


class EnqueueQueries(Session):
    """Enqueue on the store's own connection."""

    def enqueue(self, kind: str, payload_json: str, *, queue: str, priority: int, max_attempts: int,
                run_at: datetime | None, delay_s: float, dedupe_key: str | None, key: str | None = None,
                dedupe_window_s: float | None = None, debounce_s: float | None = None,
                tags: list[str] | None = None, trace: str | None = None) -> int | None:
        """Insert one job and notify; its id, or None when the dedupe key is live."""
        with self.cursor() as cur:
            return insert_job(cur, kind, payload_json, queue=queue, priority=priority, max_attempts=max_attempts,
                              run_at=run_at, delay_s=delay_s, dedupe_key=dedupe_key, key=key,
                              dedupe_window_s=dedupe_window_s, debounce_s=debounce_s, tags=tags, trace=trace)

    def enqueue_many(self, rows: Iterable[Sequence[Any]]) -> list[int | None]:
        """COPY rows (kind, queue, payload_json, priority, max_attempts, run_at, dedupe_key,
        key) in one transaction; their ids in order, None for a row a live dedupe key skipped."""
        with self.cursor(transaction=True) as cur:
            return copy_jobs(cur, rows)


def enqueue_one(conn_or_dsn: Any, kind: str, payload_json: str, **fields: Any) -> int | None:
    """Insert one job on the caller's connection, or on one of its own to a DSN."""
    if not isinstance(conn_or_dsn, str):
        with borrowed_cursor(conn_or_dsn, transaction=False) as cur:
            return insert_job(cur, kind, payload_json, **fields)
    store = EnqueueQueries(StoreConfig(dsn=conn_or_dsn))
    try:
        return store.enqueue(kind, payload_json, **fields)
    finally:
        store.close()


def enqueue_rows(conn_or_dsn: Any, rows: Iterable[Sequence[Any]]) -> list[int | None]:
    """COPY rows on the caller's connection, or on one of its own to a DSN; their ids."""
    if not isinstance(conn_or_dsn, str):
        with borrowed_cursor(conn_or_dsn, transaction=True) as cur:
            return copy_jobs(cur, rows)
    store = EnqueueQueries(StoreConfig(dsn=conn_or_dsn, statement_timeout_s=BULK_STATEMENT_TIMEOUT_S))
    try:
        return store.enqueue_many(rows)
    finally:
        store.close()


def insert_job(cur: psycopg.Cursor[Any], kind: str, payload_json: str, **fields: Any) -> int | None:
    """Insert one job and notify workers (at commit); its id, or None when the dedupe key is live.

    The NOTIFY is a statement of its own. In an open transaction both land at its commit, as
    one statement would. On an autocommit connection each is its own transaction: the row
    commits first, with the WAL flush it needs, and the notification after it, in a
    transaction that writes no WAL. PostgreSQL holds one lock for the whole cluster from a
    notifying transaction's pre-commit to its end, so a NOTIFY in the insert's own transaction
    would hold it across the flush and make concurrent enqueues commit one at a time. There,
    once the insert has committed, a wake-up that fails is logged, not raised: the caller
    must not enqueue the job again (the workers find it at their next look).
    """
    committed_alone = commits_alone(cur.connection)
    try:
        cur.execute(query(insert_query(fields)), insert_params(kind, payload_json, fields))
    except REFUSED as exc:
        raise EnqueueError(f"job rejected: {first_line(exc)}") from exc
    row = cur.fetchone()
    if row is None:
        return None
    if not committed_alone:
        cur.execute(query("notify_queue"), {"queue": fields["queue"]})
        return int(row[0])
    try:
        cur.execute(query("notify_queue"), {"queue": fields["queue"]})
    except psycopg.Error as exc:
        wake_failed(int(row[0]), exc)
    return int(row[0])


def commits_alone(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether each statement on ``conn`` is a transaction of its own (autocommit, none open)."""
    return bool(conn.autocommit) and conn.info.transaction_status == TransactionStatus.IDLE


def wake_failed(job_id: int, exc: psycopg.Error) -> None:
    log.warning("job %d is enqueued, but waking the workers failed (%s): they claim it at their next look, "
                "within their poll interval", job_id, first_line(exc))


def insert_query(fields: dict[str, Any]) -> str:
    """``job_insert_debounced`` for an enqueue with ``debounce_s``, ``job_insert_windowed`` for
    one with ``dedupe_window_s``, else ``job_insert``."""
    if fields.get("debounce_s") is not None:
        return "job_insert_debounced"
    return "job_insert_windowed" if fields.get("dedupe_window_s") is not None else "job_insert"


def insert_params(kind: str, payload_json: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The insert's parameters: the fields, no key, window or debounce meaning none."""
    return {"kind": kind, "payload": payload_json, "key": None, "dedupe_window_s": None, "debounce_s": None,
            "tags": None, "trace": None, **fields}


def insert_each(cur: psycopg.Cursor[Any], jobs: Iterable[tuple[str, str, dict[str, Any]]]) -> list[int | None]:
    """Insert (kind, payload_json, fields) jobs one statement each, in the cursor's transaction
    (``enqueue_many`` of jobs with a dedupe window or a debounce, which COPY cannot say)."""
    return [insert_job(cur, kind, payload_json, **fields) for kind, payload_json, fields in jobs]


def enqueue_each(conn_or_dsn: Any, jobs: Sequence[tuple[str, str, dict[str, Any]]]) -> list[int | None]:
    """``insert_each`` in one transaction on the caller's connection, or on one of its own."""
    if not isinstance(conn_or_dsn, str):
        with borrowed_cursor(conn_or_dsn, transaction=True) as cur:
            return insert_each(cur, jobs)
    store = EnqueueQueries(StoreConfig(dsn=conn_or_dsn, statement_timeout_s=BULK_STATEMENT_TIMEOUT_S))
    try:
        with store.cursor(transaction=True) as cur:
            return insert_each(cur, jobs)
    finally:
        store.close()


def copy_jobs(cur: psycopg.Cursor[Any], rows: Iterable[Sequence[Any]]) -> list[int | None]:
    """COPY rows into a staging table and move them into the jobs table; must run inside a
    transaction. Their ids in order, None for a row a live dedupe key skipped. The staging
    table is dropped before returning, so a caller's transaction may do this again."""
    keys: list[str | None] = []
    cur.execute(query("job_stage_create"))
    try:
        with cur.copy(query("job_stage_copy")) as copy:
            for values in rows:
                copy.write_row((*values, *(None,) * (ROW_FIELDS - len(values)), len(keys)))
                keys.append(values[6])
        cur.execute(query("job_stage_insert"))
    except REFUSED as exc:
        raise EnqueueError(f"bulk enqueue rejected: {first_line(exc)}") from exc
    ids = inserted_ids(cur.fetchall(), keys)
    cur.execute(query("job_stage_drop"))
    cur.execute(query("notify_jobs"))
    return ids


def inserted_ids(inserted: Sequence[Sequence[Any]], keys: Sequence[str | None]) -> list[int | None]:
    """Each staged row's id, or None, from ``job_stage_insert``'s (id, dedupe_key) rows by id
    and the rows' dedupe ``keys`` in order. The ids were drawn in the rows' order, and only a
    row with a key can be missing (a live job holds it; so does it for any later row with
    that key): a row takes the next id unless it has a key that id's row does not."""
    ids: list[int | None] = []
    at = 0
    for key in keys:
        if at < len(inserted) and (key is None or inserted[at][1] == key):
            ids.append(int(inserted[at][0]))
            at += 1
        else:
            ids.append(None)
    return ids


@contextlib.contextmanager
def borrowed_cursor(conn: Any, *, transaction: bool) -> Iterator[psycopg.Cursor[Any]]:
    """A cursor on a connection the caller owns, which is never closed or reconnected here.

    Inside the caller's open transaction the work joins it (commit or rollback is theirs).
    With none open, work that needs a transaction, or any work on a non-autocommit
    connection, runs in a transaction of its own, committed before returning: the caller
    is never left inside a transaction it did not open. No deadline thread: the caller
    owns the connection's timeouts.
    """
    if isinstance(conn, psycopg.AsyncConnection):
        raise EnqueueError("this is a psycopg.AsyncConnection: use `await enqueue_async(...)` "
                           "or `await enqueue_many_async(...)`")
    if not isinstance(conn, psycopg.Connection):
        raise EnqueueError(f"expected a DSN string or an open psycopg connection, got {type(conn).__name__}")
    own = needs_own_transaction(conn, transaction)
    with translate_errors(), conn.transaction() if own else contextlib.nullcontext(), UnpreparedCursor(conn) as cur:
        # JSON as Python values on this cursor only, whatever the connection's own loaders say
        # (Django's load jsonb as text): the readers here expect what psycopg gives by default.
        cur.adapters.register_loader("jsonb", JsonbLoader)
        cur.adapters.register_loader("json", JsonLoader)
        yield cur


def needs_own_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], transaction: bool) -> bool:
    """Whether work on a borrowed connection must open (and commit) a transaction of its own."""
    if conn.closed:
        raise DatabaseUnavailable("database unavailable: the connection is closed")
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise EnqueueError("the connection's transaction has failed: roll it back before enqueueing")
    return status == TransactionStatus.IDLE and (transaction or not conn.autocommit)
