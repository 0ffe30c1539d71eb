"""``strict=True`` on ``enqueue``, ``enqueue_many`` and their async twins, and ``shardworker
enqueue --strict``: a kind no live worker has registered (in that queue) is refused with one
clear line and nothing is enqueued; a kind a live worker serves goes in as usual. Without
strict nothing is asked (the view strict reads may even be gone). Real PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from shardworker import JobSpec, KindNotServed, enqueue, enqueue_async, enqueue_many, enqueue_many_async
from shardworker.core.views import Serving
from shardworker.store.pg_store import PgStore, StoreConfig
from tests.cli.cli_runner import assert_one_line_error, invoke
from tests.helpers import execute, query


@pytest.fixture
def serving(pg_dsn: str) -> Any:
    """A live worker serving ``send`` in queue ``mail`` and ``resize`` in every queue."""
    store = PgStore(StoreConfig(dsn=pg_dsn))
    store.heartbeat("w-mail", "host", 1, serves=Serving(("send",), ("mail",), 3600.0))
    store.heartbeat("w-any", "host", 2, serves=Serving(("resize",), None, 3600.0))
    yield
    store.close()


def jobs(dsn: str) -> list[tuple[Any, ...]]:
    return query(dsn, "SELECT kind, queue FROM shardworker.jobs ORDER BY id")


@pytest.mark.usefixtures("serving")
def test_strict_enqueue_takes_served_kinds_and_refuses_the_rest(pg_dsn: str) -> None:
    assert enqueue(pg_dsn, "send", queue="mail", strict=True) is not None
    assert enqueue(pg_dsn, "resize", queue="anything", strict=True) is not None
    with pytest.raises(KindNotServed, match="no live worker handles 'send' in queue 'default'"):
        enqueue(pg_dsn, "send", strict=True)
    with pytest.raises(KindNotServed, match="'sned' in queue 'mail'"):
        enqueue(pg_dsn, "sned", queue="mail", strict=True, after=[1])
    assert jobs(pg_dsn) == [("send", "mail"), ("resize", "anything")]


@pytest.mark.usefixtures("serving")
def test_strict_enqueue_many_refuses_the_whole_batch(pg_dsn: str) -> None:
    good = [JobSpec("send", None, "mail"), JobSpec("resize")]
    assert len(enqueue_many(pg_dsn, good, strict=True)) == 2
    with pytest.raises(KindNotServed) as caught:
        enqueue_many(pg_dsn, [*good, JobSpec("emial", None, "mail")], strict=True)
    assert "'emial' in queue 'mail'" in str(caught.value) and "'send'" not in str(caught.value)
    assert len(jobs(pg_dsn)) == 2


@pytest.mark.usefixtures("serving")
def test_strict_enqueue_in_the_callers_transaction(pg_dsn: str) -> None:
    """On the caller's connection the check joins its transaction, which stays usable."""
    with psycopg.connect(pg_dsn) as conn:
        enqueue(conn, "send", queue="mail", strict=True)
        with pytest.raises(KindNotServed):
            enqueue(conn, "nobody", strict=True)
        enqueue(conn, "resize", strict=True)
    assert jobs(pg_dsn) == [("send", "mail"), ("resize", "default")]


@pytest.mark.usefixtures("serving")
def test_strict_async_twins(pg_dsn: str) -> None:
    async def main() -> None:
        assert await enqueue_async(pg_dsn, "send", queue="mail", strict=True) is not None
        with pytest.raises(KindNotServed):
            await enqueue_async(pg_dsn, "send", strict=True)
        aconn = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
        async with aconn:
            assert len(await enqueue_many_async(aconn, [JobSpec("resize")], strict=True)) == 1
            with pytest.raises(KindNotServed):
                await enqueue_many_async(aconn, [JobSpec("resize"), JobSpec("x")], strict=True)

    asyncio.run(main())
    assert jobs(pg_dsn) == [("send", "mail"), ("resize", "default")]


def test_a_worker_past_its_rescue_window_serves_nothing(pg_dsn: str) -> None:
    store = PgStore(StoreConfig(dsn=pg_dsn))
    try:
        store.heartbeat("w", "host", 1, serves=Serving(("send",), None, 30.0))
    finally:
        store.close()
    enqueue(pg_dsn, "send", strict=True)
    execute(pg_dsn, "UPDATE shardworker.workers SET heartbeat_at = now() - interval '1 minute'")
    with pytest.raises(KindNotServed):
        enqueue(pg_dsn, "send", strict=True)


def test_without_strict_nothing_is_asked(pg_dsn: str) -> None:
    """The normal path costs what it did: with the view strict reads gone, enqueue still works."""
    execute(pg_dsn, "DROP VIEW shardworker.serving_workers")
    assert enqueue(pg_dsn, "anything") is not None
    assert len(enqueue_many(pg_dsn, [JobSpec("a"), JobSpec("b")])) == 2

    async def main() -> None:
        assert await enqueue_async(pg_dsn, "c") is not None
        assert len(await enqueue_many_async(pg_dsn, [JobSpec("d")])) == 1

    asyncio.run(main())
    assert len(jobs(pg_dsn)) == 5


@pytest.mark.usefixtures("serving")
def test_the_cli_strict_refuses_with_one_line_and_exit_1(pg_dsn: str, tmp_path: Any) -> None:
    ok = invoke("enqueue", "send", "--queue", "mail", "--strict", "--dsn", pg_dsn)
    assert ok.exit_code == 0, ok.output
    refused = invoke("enqueue", "sedn", "--queue", "mail", "--strict", "--dsn", pg_dsn)
    assert_one_line_error(refused, "no live worker handles 'sedn' in queue 'mail'", "nothing enqueued")
    bulk = tmp_path / "jobs.jsonl"
    bulk.write_text('{"kind": "resize"}\n{"kind": "send", "queue": "bulk"}\n')
    refused = invoke("enqueue", "--file", str(bulk), "--strict", "--dsn", pg_dsn)
    assert_one_line_error(refused, "'send' in queue 'bulk'")
    refused = invoke("enqueue", "nobody", "--count", "3", "--strict", "--dsn", pg_dsn)
    assert_one_line_error(refused, "'nobody' in queue 'default'")
    assert jobs(pg_dsn) == [("send", "mail")]
