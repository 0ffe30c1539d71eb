"""An asyncio connection pool for a web application (``shardworker.asgi``): psycopg's own
``AsyncConnectionPool``, with the store's bounded connection options (connect timeout, TCP
liveness, no server-side prepares: PgBouncer safe). Its connections are *not* autocommit: a
``pool.connection()`` block is one transaction, committed when it ends, rolled back on an
exception, so a job enqueued in it exists only with the rest of the request's writes."""

from __future__ import annotations

from typing import Any

import psycopg

from shardworker.core.config import StoreConfig
from shardworker.core.views import JobInfo
from shardworker.errors import ConfigError
from shardworker.store.connection import connect_options, translate_errors
from shardworker.store.sql import query


def make_pool(dsn: str, *, min_size: int, max_size: int, application_name: str) -> Any:
    """A pool of ``min_size`` to ``max_size`` connections to ``dsn``, not yet opened."""
    try:
        from psycopg_pool import AsyncConnectionPool
    except ImportError:
        raise ConfigError("shardworker.asgi needs psycopg-pool: pip install 'shardworker[asgi]'") from None
    config = StoreConfig(dsn=dsn, application_name=application_name)
    options = {**connect_options(config, startup_options=False), "autocommit": False}
    return AsyncConnectionPool(dsn, kwargs=options, min_size=min_size, max_size=max_size, open=False,
                               name="shardworker")


async def read_job(pool: Any, job_id: int) -> JobInfo | None:
    """One job as ``shardworker.get_job`` reads it, on a pooled connection held for that read only."""
    with translate_errors():
        async with pool.connection() as aconn:
            cur = await aconn.execute(query("job_get"), {"id": job_id}, prepare=False)
            row = await cur.fetchone()
    return None if row is None else JobInfo(*row)


def is_async_connection(value: Any) -> bool:
    return isinstance(value, psycopg.AsyncConnection)
