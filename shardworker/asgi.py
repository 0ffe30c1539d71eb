"""shardworker in a Starlette or FastAPI application: a connection pool opened in the app's
lifespan, a transaction per request that enqueues with the request's writes, and a job's
progress and status streamed to a browser as server-sent events.

::

    import shardworker
    from fastapi import FastAPI, Request
    from shardworker.asgi import Lifespan, job_events, transaction

    app = FastAPI(lifespan=Lifespan("postgresql://app@db/app"))   # or SHARDWORKER_DSN

    @app.post("/orders")
    async def create_order(request: Request, email: str) -> dict:
        async with transaction(request) as conn:           # one transaction: the order and its job
            cur = await conn.execute("INSERT INTO orders (email) VALUES (%s) RETURNING id", (email,))
            (order_id,) = await cur.fetchone()
            job_id = await shardworker.enqueue_async(conn, "receipt", {"order": order_id})
        return {"order": order_id, "job": job_id}

    @app.get("/jobs/{job_id}/events")
    async def follow(request: Request, job_id: int):
        return job_events(request, job_id)                  # text/event-stream until the job ends

``Lifespan`` opens a ``psycopg_pool.AsyncConnectionPool`` (``pip install 'shardworker[asgi]'``)
when the app starts and closes it when it stops (``then=`` nests the app's own lifespan);
``pool(request)`` is that pool, ``transaction(request)`` one of its connections for one
transaction (committed at the block's end, rolled back on an exception: the job exists only
if the request's writes commit). ``shardworker.wait_for_async(conn, job_id, timeout_s)`` on a
pooled connection (``async with pool(request).connection() as conn``) awaits a job's end.
``job_events`` streams ``progress`` events (each new ``job.progress`` value), ``status`` events
(each change, with what a waiting job waits on) and a last ``end`` event (the job as
``jobs show --json`` prints it), or ``timeout``/``gone``; a client that goes away ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from shardworker.core.views import JobInfo
from shardworker.errors import ConfigError
from shardworker.jobs import dumps_json

FINAL = ("done", "failed", "cancelled")
KEEPALIVE_S = 15.0  # a comment line this often while nothing changes
STATE_NAME = "shardworker_pool"


class Lifespan:
    """``FastAPI(lifespan=Lifespan(dsn))`` or ``Starlette(lifespan=...)``: the pool of
    ``min_size`` to ``max_size`` connections, open while the app runs; ``then``: the app's own
    lifespan (an ``app -> async context manager``), run inside it."""

    def __init__(self, dsn: str | None = None, *, min_size: int = 1, max_size: int = 10,
                 then: Callable[[Any], contextlib.AbstractAsyncContextManager[Any]] | None = None,
                 open_timeout_s: float = 30.0) -> None:
        dsn = dsn or os.environ.get("SHARDWORKER_DSN")
        if not dsn:
            raise ConfigError("shardworker.asgi.Lifespan needs a DSN (or SHARDWORKER_DSN)")
        if not 1 <= min_size <= max_size:
            raise ConfigError(f"the pool's sizes must be 1 <= min_size <= max_size, not {min_size} and {max_size}")
        self.dsn, self.min_size, self.max_size, self.then = dsn, min_size, max_size, then
        self.open_timeout_s = open_timeout_s

    def __call__(self, app: Any) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._running(app)

    @contextlib.asynccontextmanager
    async def _running(self, app: Any) -> AsyncIterator[Any]:
        from shardworker.store.pool import make_pool

        made = make_pool(self.dsn, min_size=self.min_size, max_size=self.max_size, application_name="shardworker-asgi")
        await made.open(wait=True, timeout=self.open_timeout_s)
        setattr(app.state, STATE_NAME, made)
        try:
            if self.then is None:
                yield None
            else:
                async with self.then(app) as state:
                    yield state
        finally:
            await made.close()


def pool(request: Any) -> Any:
    """The ``Lifespan``'s pool, from a request (or a WebSocket) of its app."""
    found = getattr(request.app.state, STATE_NAME, None)
    if found is None:
        raise ConfigError("no shardworker pool on this app: give it lifespan=shardworker.asgi.Lifespan(dsn)")
    return found


@contextlib.asynccontextmanager
async def transaction(request: Any) -> AsyncIterator[Any]:
    """``async with transaction(request) as conn``: a pooled connection inside one transaction,
    begun at once (an enqueue as the block's first statement joins it, not a transaction of its
    own), committed when the block ends, rolled back on an exception."""
    async with pool(request).connection() as conn, conn.transaction():
        yield conn


def job_events(request: Any, job_id: int, *, timeout_s: float = 3600.0, every_s: float = 0.5,
               schema: str | None = None) -> Any:
    """A ``text/event-stream`` response that follows job ``job_id`` (read every ``every_s``)
    until it ends, ``timeout_s`` passes, or the client goes away. The job is read in
    ``schema``, else in the schema in use when this is called (a ``using_schema`` block
    around the route's return has ended by the time the stream is read)."""
    from starlette.responses import StreamingResponse

    from shardworker.store.sql import current_schema, using_schema

    with using_schema(schema):
        chosen = current_schema()  # (checked)
    return StreamingResponse(follow(pool(request), job_id, timeout_s=timeout_s, every_s=every_s, schema=chosen),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


async def follow(job_pool: Any, job_id: int, *, timeout_s: float, every_s: float,
                 schema: str | None = None) -> AsyncIterator[str]:
    """The server-sent events of ``job_events``, as text; the job read in ``schema``."""
    from shardworker.store.pool import read_job
    from shardworker.store.sql import using_schema

    deadline = time.monotonic() + timeout_s
    status: str | None = None
    progress: Any = None
    said = time.monotonic()
    while True:
        with using_schema(schema):  # (around the read alone: a block never spans a yield)
            job = await read_job(job_pool, job_id)
        if time.monotonic() - said >= KEEPALIVE_S:  # a proxy drops a stream silent for a minute
            said = time.monotonic()
            yield ": still following\n\n"
        if job is None:
            yield _event("gone", {"id": job_id})
            return
        if job.progress is not None and job.progress != progress:
            progress = job.progress
            yield _event("progress", progress)
        if job.status != status:
            status = job.status
            yield _event("status", _status(job))
        if job.status in FINAL:
            yield _event("end", job.to_json())
            return
        if time.monotonic() >= deadline:
            yield _event("timeout", _status(job))
            return
        await asyncio.sleep(every_s)


def _status(job: JobInfo) -> dict[str, Any]:
    return {"id": job.id, "status": job.status, "waiting_on": job.waiting_on or None}


def _event(name: str, data: Any) -> str:
    """One server-sent event; its data is JSON on one line."""
    return f"event: {name}\ndata: {dumps_json(data)}\n\n"
