"""``enqueue_async`` and ``enqueue_many_async`` on a ``psycopg.AsyncConnection``: the job joins
the caller's transaction (the transactional outbox), a connection of the caller's is never
left in a transaction it did not open, and a wait in the database never blocks the event loop.
Real PostgreSQL throughout; each test drives its own event loop with ``asyncio.run``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from shardworker import JobSpec, enqueue, enqueue_async, enqueue_many_async, get_job
from shardworker.errors import DatabaseUnavailable, EnqueueError
from tests.conftest import free_port


def rows(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        return conn.execute(sql).fetchall()


def make_orders_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        conn.execute("CREATE TABLE orders (id bigserial PRIMARY KEY, item text NOT NULL)")


async def aconnect(dsn: str, *, autocommit: bool = True) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(dsn, autocommit=autocommit, connect_timeout=5)


def test_enqueue_async_with_a_dsn_inserts_the_job_and_wakes_workers(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as listener:
        listener.execute("LISTEN shardworker_jobs")
        job_id = asyncio.run(enqueue_async(pg_dsn, "email", {"to": "a@example.com"}, queue="mail", priority=3))
        woken = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert woken == ["mail"]
    assert job_id is not None
    job = get_job(pg_dsn, job_id)
    assert (job.kind, job.queue, job.status, job.priority, job.payload) == (
        "email", "mail", "queued", 3, {"to": "a@example.com"})


def test_the_business_write_and_the_job_commit_together(pg_dsn: str) -> None:
    """The transactional outbox: an order and its confirmation job land in one commit."""
    make_orders_table(pg_dsn)

    async def place_order() -> int | None:
        async with await aconnect(pg_dsn) as aconn, aconn.transaction():
            cur = await aconn.execute("INSERT INTO orders (item) VALUES ('book') RETURNING id")
            order = await cur.fetchone()
            assert order is not None
            job_id = await enqueue_async(aconn, "confirm_order", {"order": order[0]})
            # Not visible outside the transaction until it commits.
            assert rows(pg_dsn, "SELECT count(*) FROM shardworker.jobs") == [(0,)]
            return job_id

    job_id = asyncio.run(place_order())
    assert rows(pg_dsn, "SELECT item FROM orders") == [("book",)]
    assert rows(pg_dsn, "SELECT id, kind, payload->>'order' FROM shardworker.jobs") == [(job_id, "confirm_order", "1")]


def test_a_rollback_leaves_neither_the_business_row_nor_the_job(pg_dsn: str) -> None:
    make_orders_table(pg_dsn)

    class PaymentDeclined(Exception):
        pass

    async def place_order() -> None:
        async with await aconnect(pg_dsn) as aconn:
            with pytest.raises(PaymentDeclined):
                async with aconn.transaction():
                    await aconn.execute("INSERT INTO orders (item) VALUES ('book')")
                    await enqueue_async(aconn, "confirm_order", {"order": 1})
                    await enqueue_many_async(aconn, [JobSpec("audit", {"n": n}) for n in range(3)])
                    raise PaymentDeclined
            assert aconn.info.transaction_status == TransactionStatus.IDLE

    asyncio.run(place_order())
    assert rows(pg_dsn, "SELECT count(*) FROM orders") == [(0,)]
    assert rows(pg_dsn, "SELECT count(*) FROM shardworker.jobs") == [(0,)]


def test_an_idle_non_autocommit_connection_is_not_left_in_a_transaction(pg_dsn: str) -> None:
    """With no transaction open, the job commits on its own: the caller's connection stays
    idle, and the job is visible to others at once."""

    async def go() -> None:
        async with await aconnect(pg_dsn, autocommit=False) as aconn:
            await enqueue_async(aconn, "k", 1)
            assert aconn.info.transaction_status == TransactionStatus.IDLE
            assert rows(pg_dsn, "SELECT count(*) FROM shardworker.jobs") == [(1,)]
            assert len(await enqueue_many_async(aconn, [JobSpec("k", n) for n in range(4)])) == 4
            assert aconn.info.transaction_status == TransactionStatus.IDLE
            assert not aconn.closed

    asyncio.run(go())
    assert rows(pg_dsn, "SELECT count(*) FROM shardworker.jobs") == [(5,)]


def test_a_live_dedupe_key_returns_none_and_bulk_skips_it(pg_dsn: str) -> None:
    async def go() -> tuple[int | None, int | None, list[int | None]]:
        async with await aconnect(pg_dsn) as aconn:
            first = await enqueue_async(aconn, "report", dedupe_key="daily")
            second = await enqueue_async(aconn, "report", dedupe_key="daily")
            bulk = await enqueue_many_async(aconn, [JobSpec("report", dedupe_key="daily"),
                                                    JobSpec("report", dedupe_key="weekly")])
            return first, second, bulk

    first, second, bulk = asyncio.run(go())
    assert first is not None and second is None and bulk[0] is None and bulk[1] is not None
    assert rows(pg_dsn, "SELECT dedupe_key FROM shardworker.jobs ORDER BY id") == [("daily",), ("weekly",)]


def test_waiting_in_the_database_does_not_block_the_event_loop(pg_dsn: str) -> None:
    """An enqueue that waits on another transaction's row lock (the same dedupe key, not yet
    committed) lets other coroutines run meanwhile, and returns None once that one commits."""
    with psycopg.connect(pg_dsn, autocommit=False) as holder:
        holder.execute("SELECT 1")  # opens holder's transaction, which the enqueue joins
        enqueue(holder, "report", dedupe_key="daily")

        async def go() -> tuple[int | None, int]:
            ticks = 0

            async with await aconnect(pg_dsn) as aconn:
                waiting = asyncio.create_task(enqueue_async(aconn, "report", dedupe_key="daily"))

                async def ticker() -> None:  # counts only while the insert waits
                    nonlocal ticks
                    while not waiting.done():
                        ticks += 1
                        await asyncio.sleep(0.01)

                tick_task = asyncio.create_task(ticker())
                await asyncio.sleep(0.5)
                assert not waiting.done(), "the insert should wait for the holder's transaction"
                await asyncio.to_thread(holder.commit)
                result = await asyncio.wait_for(waiting, 10)
            tick_task.cancel()
            return result, ticks

        started = time.monotonic()
        result, ticks = asyncio.run(go())
    assert result is None
    # 0.5 s of waiting at a 10 ms tick (about 50 on an idle machine): a loop blocked by the
    # waiting insert could not tick at all until the holder commits.
    assert ticks >= 5, f"the event loop ticked {ticks} times in {time.monotonic() - started:.2f} s"
    assert rows(pg_dsn, "SELECT count(*) FROM shardworker.jobs") == [(1,)]


def test_bad_input_is_refused_before_anything_is_sent(pg_dsn: str) -> None:
    async def go() -> None:
        async with await aconnect(pg_dsn) as aconn:
            with pytest.raises(EnqueueError, match="priority"):
                await enqueue_async(aconn, "k", priority=2**40)
            with pytest.raises(EnqueueError, match="not JSON-serializable"):
                await enqueue_async(aconn, "k", {"when": object()})
            with pytest.raises(EnqueueError, match="not JSON-serializable"):
                await enqueue_many_async(aconn, [JobSpec("k", 1), JobSpec("k", {1j})])
            assert aconn.info.transaction_status == TransactionStatus.IDLE

    asyncio.run(go())
    assert rows(pg_dsn, "SELECT count(*) FROM shardworker.jobs") == [(0,)]


def test_the_wrong_kind_of_connection_is_named(pg_dsn: str) -> None:
    with (psycopg.connect(pg_dsn, autocommit=True) as sync_conn,
          pytest.raises(EnqueueError, match="sync psycopg connection: call enqueue")):
        asyncio.run(enqueue_async(sync_conn, "k"))

    async def async_to_sync() -> None:
        async with await aconnect(pg_dsn) as aconn:
            with pytest.raises(EnqueueError, match="AsyncConnection: use `await enqueue_async"):
                enqueue(aconn, "k")

    asyncio.run(async_to_sync())
    with pytest.raises(EnqueueError, match="got int"):
        asyncio.run(enqueue_async(42, "k"))


def test_an_aborted_transaction_is_refused_and_left_to_the_caller(pg_dsn: str) -> None:
    async def go() -> None:
        async with await aconnect(pg_dsn, autocommit=False) as aconn:
            with pytest.raises(psycopg.errors.UndefinedTable):
                await aconn.execute("SELECT * FROM no_such_table")
            with pytest.raises(EnqueueError, match="roll it back"):
                await enqueue_async(aconn, "k")
            await aconn.rollback()
            assert await enqueue_async(aconn, "k") is not None

    asyncio.run(go())
    assert rows(pg_dsn, "SELECT count(*) FROM shardworker.jobs") == [(1,)]


def test_a_refused_connection_is_database_unavailable() -> None:
    dsn = f"postgresql://shardworker:secret-pw@127.0.0.1:{free_port()}/nowhere"
    with pytest.raises(DatabaseUnavailable) as caught:
        asyncio.run(enqueue_async(dsn, "k"))
    assert "secret-pw" not in str(caught.value)


def test_a_closed_connection_is_not_reopened(pg_dsn: str) -> None:
    async def go() -> None:
        aconn = await aconnect(pg_dsn)
        await aconn.close()
        with pytest.raises(DatabaseUnavailable, match="closed"):
            await enqueue_async(aconn, "k")
        assert aconn.closed

    asyncio.run(go())
