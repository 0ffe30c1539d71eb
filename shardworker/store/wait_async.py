"""Waiting for a job's end from asyncio code (``shardworker.wait_for_async``): what
``job_queries.wait_job_end`` does, on a ``psycopg.AsyncConnection`` (the caller's, or one of
its own to a DSN), so the event loop runs on while it waits."""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from shardworker.core.config import StoreConfig
from shardworker.core.views import JobInfo
from shardworker.errors import DatabaseUnavailable, JobsError
from shardworker.store.connection import connect_async, translate_errors
from shardworker.store.job_queries import FINAL_STATUSES, PROGRESS_RECHECK_S, RECHECK_S, ProgressSeen
from shardworker.store.sql import channel, query


async def wait_job_end_async(conn_or_dsn: Any, job_id: int, timeout_s: float,
                             on_progress: Callable[[Any], Any] | None = None) -> tuple[JobInfo | None, bool]:
    """The job once it is done, failed or cancelled (or gone), and True; or the job as it
    was when ``timeout_s`` ran out first, and False. It LISTENs before it reads the row, as
    ``wait_job_end`` does; on the caller's connection the subscription is undone before
    returning. ``on_progress`` as there; it may be a coroutine function."""
    if not isinstance(conn_or_dsn, str):
        aconn = idle_async_connection(conn_or_dsn)
        try:
            return await _wait_on(aconn, job_id, timeout_s, on_progress)
        finally:
            with contextlib.suppress(psycopg.Error):
                await _run(aconn, "unlisten_finished")
    config = StoreConfig(dsn=conn_or_dsn)
    with translate_errors():
        aconn = await connect_async(config)
    try:
        return await _wait_on(aconn, job_id, timeout_s, on_progress)
    finally:
        await aconn.close()


async def _wait_on(aconn: psycopg.AsyncConnection[Any], job_id: int, timeout_s: float,
                   on_progress: Callable[[Any], Any] | None = None) -> tuple[JobInfo | None, bool]:
    deadline = time.monotonic() + max(0.0, timeout_s)
    seen = ProgressSeen()
    with translate_errors():
        await _run(aconn, "listen_finished")
        while True:
            row = await _run(aconn, "job_get", {"id": job_id})
            job = None if row is None else JobInfo(*row)
            if on_progress is not None and seen.new(job) and inspect.isawaitable(told := on_progress(seen.last)):
                await told
            if job is None or job.status in FINAL_STATUSES:
                return job, True
            if time.monotonic() >= deadline:
                return job, False
            again = RECHECK_S if on_progress is None else PROGRESS_RECHECK_S
            await _finished_note(aconn, job_id, min(deadline, time.monotonic() + again))


async def _finished_note(aconn: psycopg.AsyncConnection[Any], job_id: int, until: float) -> None:
    """Return when ``job_id``'s end is announced, or at ``until`` (monotonic) at the latest."""
    while (remaining := until - time.monotonic()) > 0:
        async for note in aconn.notifies(timeout=remaining, stop_after=1):
            if note.channel == channel("finished") and str(job_id) in note.payload.split(","):
                return


async def _run(aconn: psycopg.AsyncConnection[Any], name: str,
               params: dict[str, Any] | None = None) -> tuple[Any, ...] | None:
    """One statement, committed at once on a connection that is not in autocommit."""
    cur = await aconn.execute(query(name), params, prepare=False)  # see UnpreparedCursor
    row = await cur.fetchone() if cur.description else None
    if not aconn.autocommit:
        await aconn.commit()
    return row


def idle_async_connection(aconn: Any) -> psycopg.AsyncConnection[Any]:
    """The caller's async connection, checked to be open and outside a transaction."""
    if isinstance(aconn, psycopg.Connection):
        raise JobsError("this is a sync psycopg connection: call shardworker.wait_for(conn, job_id), "
                        "or pass a psycopg.AsyncConnection")
    if not isinstance(aconn, psycopg.AsyncConnection):
        raise JobsError(f"expected a DSN string or an open psycopg.AsyncConnection, got {type(aconn).__name__}")
    if aconn.closed:
        raise DatabaseUnavailable("database unavailable: the connection is closed")
    if aconn.info.transaction_status != TransactionStatus.IDLE:
        raise JobsError("wait_for_async needs a connection outside a transaction: PostgreSQL delivers "
                        "notifications only between transactions")
    return aconn
