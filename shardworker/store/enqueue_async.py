"""Enqueue from asyncio code (``shardworker.enqueue_async``): the same rules as
``shardworker.store.enqueue`` on a ``psycopg.AsyncConnection``, the caller's or one of its
own to a DSN. Nothing here blocks the event loop."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import psycopg

from shardworker.core.config import StoreConfig
from shardworker.errors import EnqueueError
from shardworker.store.connection import AsyncUnpreparedCursor, connect_async, first_line, translate_errors
from shardworker.store.enqueue import (
    BULK_STATEMENT_TIMEOUT_S,
    REFUSED,
    ROW_FIELDS,
    commits_alone,
    insert_params,
    insert_query,
    inserted_ids,
    needs_own_transaction,
    wake_failed,
)
from shardworker.store.sql import query


async def enqueue_one_async(conn_or_dsn: Any, kind: str, payload_json: str, **fields: Any) -> int | None:
    """Insert one job and notify workers (at commit); its id, or None when the dedupe key is live."""
    async with async_cursor_for(conn_or_dsn, transaction=False) as cur:
        return await insert_job_async(cur, kind, payload_json, fields)


async def insert_job_async(cur: psycopg.AsyncCursor[Any], kind: str, payload_json: str,
                           fields: dict[str, Any]) -> int | None:
    """``insert_job`` on an async cursor."""
    committed_alone = commits_alone(cur.connection)
    try:
        await cur.execute(query(insert_query(fields)), insert_params(kind, payload_json, fields))
    except REFUSED as exc:
        raise EnqueueError(f"job rejected: {first_line(exc)}") from exc
    row = await cur.fetchone()
    if row is None:
        return None
    try:
        await cur.execute(query("notify_queue"), {"queue": fields["queue"]})  # its own statement: see insert_job
    except psycopg.Error as exc:
        if not committed_alone:
            raise
        wake_failed(int(row[0]), exc)
    return int(row[0])


async def enqueue_each_async(conn_or_dsn: Any, jobs: Sequence[tuple[str, str, dict[str, Any]]]) -> list[int | None]:
    """``enqueue_each`` for asyncio code: one statement a job, in one transaction."""
    config = StoreConfig(dsn=conn_or_dsn, statement_timeout_s=BULK_STATEMENT_TIMEOUT_S) \
        if isinstance(conn_or_dsn, str) else None
    async with async_cursor_for(conn_or_dsn, transaction=True, config=config) as cur:
        return [await insert_job_async(cur, kind, payload_json, fields) for kind, payload_json, fields in jobs]


async def enqueue_rows_async(conn_or_dsn: Any, rows: Iterable[Sequence[Any]]) -> list[int | None]:
    """COPY rows through a staging table in one transaction; their ids in order, None for
    a row a live dedupe key skipped."""
    config = StoreConfig(dsn=conn_or_dsn, statement_timeout_s=BULK_STATEMENT_TIMEOUT_S) \
        if isinstance(conn_or_dsn, str) else None
    keys: list[str | None] = []
    async with async_cursor_for(conn_or_dsn, transaction=True, config=config) as cur:
        await cur.execute(query("job_stage_create"))
        try:
            async with cur.copy(query("job_stage_copy")) as copy:
                for values in rows:
                    await copy.write_row((*values, *(None,) * (ROW_FIELDS - len(values)), len(keys)))
                    keys.append(values[6])
            await cur.execute(query("job_stage_insert"))
        except REFUSED as exc:
            raise EnqueueError(f"bulk enqueue rejected: {first_line(exc)}") from exc
        ids = inserted_ids(await cur.fetchall(), keys)
        await cur.execute(query("job_stage_drop"))
        await cur.execute(query("notify_jobs"))
    return ids


@contextlib.asynccontextmanager
async def borrowed_async_cursor(aconn: Any, *, transaction: bool) -> AsyncIterator[psycopg.AsyncCursor[Any]]:
    """``borrowed_cursor`` for a ``psycopg.AsyncConnection``: the same transaction rules."""
    if isinstance(aconn, psycopg.Connection):
        raise EnqueueError("this is a sync psycopg connection: call enqueue() or enqueue_many(), "
                           "or pass a psycopg.AsyncConnection")
    if not isinstance(aconn, psycopg.AsyncConnection):
        raise EnqueueError(f"expected a DSN string or an open psycopg.AsyncConnection, got {type(aconn).__name__}")
    own = needs_own_transaction(aconn, transaction)
    with translate_errors():
        async with aconn.transaction() if own else contextlib.nullcontext(), AsyncUnpreparedCursor(aconn) as cur:
            yield cur


@contextlib.asynccontextmanager
async def async_cursor_for(conn_or_dsn: Any, *, transaction: bool,
                           config: StoreConfig | None = None) -> AsyncIterator[psycopg.AsyncCursor[Any]]:
    """A cursor on the caller's async connection, or on one of its own to a DSN, opened
    with the store's bounds (connect and statement timeouts, TCP liveness) and closed here."""
    if not isinstance(conn_or_dsn, str):
        async with borrowed_async_cursor(conn_or_dsn, transaction=transaction) as cur:
            yield cur
        return
    config = config or StoreConfig(dsn=conn_or_dsn)
    with translate_errors():
        aconn = await connect_async(config)
    try:
        async with borrowed_async_cursor(aconn, transaction=transaction) as cur:
            yield cur
    finally:
        await aconn.close()
