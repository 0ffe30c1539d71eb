"""``enqueue`` on an autocommit connection: the job commits with its own statement, and the
wake-up of the workers follows it in the same round trip. Once the job is committed, a wake-up
that fails (here a ``pg_notify`` that the session's search_path makes fail, a real error from
the server) is logged, not raised: an application that retries on an error would otherwise
enqueue the job twice. In an open transaction the same failure fails the transaction, and
nothing is committed."""

from __future__ import annotations

import asyncio
import logging

import psycopg
import pytest

import shardworker
from shardworker.errors import StoreError
from tests.helpers import execute, query

SABOTAGE = """CREATE SCHEMA sabotage;
CREATE FUNCTION sabotage.pg_notify(text, text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'notifications refused'; END $$"""


def test_a_failed_wake_up_after_the_commit_is_logged_not_raised(pg_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    execute(pg_dsn, SABOTAGE)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SET search_path = sabotage, pg_catalog, public")
        with caplog.at_level(logging.WARNING, logger="shardworker.store.enqueue"):
            job_id = shardworker.enqueue(conn, "count", {"n": 1})
    assert job_id is not None
    assert query(pg_dsn, "SELECT id, status FROM shardworker.jobs") == [(job_id, "queued")]
    assert f"job {job_id} is enqueued, but waking the workers failed" in caplog.text


def test_the_async_enqueue_logs_a_failed_wake_up_too(pg_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    execute(pg_dsn, SABOTAGE)

    async def enqueue() -> int | None:
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as aconn:
            await aconn.execute("SET search_path = sabotage, pg_catalog, public")
            return await shardworker.enqueue_async(aconn, "count", {"n": 2})

    with caplog.at_level(logging.WARNING, logger="shardworker.store.enqueue"):
        job_id = asyncio.run(enqueue())
    assert job_id is not None and query(pg_dsn, "SELECT id FROM shardworker.jobs") == [(job_id,)]
    assert "waking the workers failed" in caplog.text


def test_in_an_open_transaction_the_failure_fails_it_and_nothing_commits(pg_dsn: str) -> None:
    execute(pg_dsn, SABOTAGE)
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("SET search_path = sabotage, pg_catalog, public")
        conn.commit()
        with pytest.raises(StoreError), conn.transaction():
            shardworker.enqueue(conn, "count", {"n": 3})
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs") == [(0,)]
