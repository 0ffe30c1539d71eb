"""The Python API a new user reached for: ``enqueue_many`` (and its async twin) return the
ids, on the COPY path and on the ``after=`` path alike; ``wait_for_async`` waits without
blocking the event loop, and each of ``wait_for`` and ``wait_for_async`` given the other's
kind of connection names the right call; every exception the docs name imports from
``shardworker``. Real PostgreSQL throughout."""

from __future__ import annotations

import asyncio
import builtins
import re
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import shardworker
from shardworker import JobSpec, enqueue_many, enqueue_many_async
from shardworker.core.model import Outcome
from shardworker.store.pg_store import PgStore, StoreConfig
from tests.helpers import query

REPO = Path(__file__).resolve().parents[2]


def kinds_by_id(dsn: str, ids: list[int | None]) -> list[tuple[str, Any] | None]:
    found = {i: (k, p) for i, k, p in query(dsn, "SELECT id, kind, payload FROM shardworker.jobs")}
    return [None if i is None else found[i] for i in ids]


def test_enqueue_many_returns_the_ids_in_order_and_none_for_a_live_dedupe_key(pg_dsn: str) -> None:
    """COPY path: one id a spec, in the order given; a spec whose dedupe key a live job holds
    gets None (nothing inserted for it)."""
    ids = enqueue_many(pg_dsn, [JobSpec("a", 1), JobSpec("b", 2), JobSpec("c", 3, dedupe_key="daily")])
    assert kinds_by_id(pg_dsn, ids) == [("a", 1), ("b", 2), ("c", 3)]
    assert ids == sorted(ids)  # ids drawn in the order given
    again = enqueue_many(pg_dsn, [JobSpec("c", 4, dedupe_key="daily"), JobSpec("d", 5)])
    assert again[0] is None and kinds_by_id(pg_dsn, again) == [None, ("d", 5)]
    with psycopg.connect(pg_dsn) as conn:  # the caller's connection and transaction
        assert len(enqueue_many(conn, [JobSpec("e")] * 3)) == 3
    assert enqueue_many(pg_dsn, []) == []
    # Keys repeated within the batch and held by a live job, among jobs without a key.
    mixed = enqueue_many(pg_dsn, [JobSpec("m", n, dedupe_key=key) for n, key in enumerate(
        ["k1", None, "k1", "k2", "daily", None, "k2", "k3"])])
    assert [i is not None for i in mixed] == [True, True, False, True, False, True, False, True]
    assert kinds_by_id(pg_dsn, mixed) == [("m", 0), ("m", 1), None, ("m", 3), None, ("m", 5), None, ("m", 7)]


def test_enqueue_many_with_after_returns_the_ids_too(pg_dsn: str) -> None:
    """after= path (shardworker.store.dependencies): the same list, None for a live dedupe key."""
    [first] = enqueue_many(pg_dsn, [JobSpec("first")])
    assert first is not None
    ids = enqueue_many(pg_dsn, [JobSpec("x", dedupe_key="k"), JobSpec("y", after=(first,))])
    assert kinds_by_id(pg_dsn, ids) == [("x", None), ("y", None)]
    assert query(pg_dsn, "SELECT status FROM shardworker.jobs WHERE id = %s", ids[1]) == [("waiting",)]
    again = enqueue_many(pg_dsn, [JobSpec("x", dedupe_key="k"), JobSpec("z", after=(first,))])
    assert again[0] is None and kinds_by_id(pg_dsn, again)[1] == ("z", None)


def test_enqueue_many_async_returns_the_ids(pg_dsn: str) -> None:
    async def go() -> tuple[list[int | None], list[int | None]]:
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as aconn:
            plain = await enqueue_many_async(aconn, [JobSpec("a", 1), JobSpec("b", 2, dedupe_key="k")])
            waiting = await enqueue_many_async(pg_dsn, [JobSpec("b", 3, dedupe_key="k"),
                                                        JobSpec("c", 4, after=(plain[0],))])
            return plain, waiting

    plain, waiting = asyncio.run(go())
    assert kinds_by_id(pg_dsn, plain) == [("a", 1), ("b", 2)]
    assert waiting[0] is None and kinds_by_id(pg_dsn, waiting)[1] == ("c", 4)


def finish_later(dsn: str, job_id: int, after_s: float) -> threading.Thread:
    """Claim the job and apply a done outcome with the worker's statements, ``after_s`` from now."""
    def run() -> None:
        time.sleep(after_s)
        store = PgStore(StoreConfig(dsn=dsn))
        try:
            [job] = store.claim(["k"], None, "w1", 1)
            store.apply_outcomes([Outcome.done(job.id, job.attempt, b'{"n": 1}')])
        finally:
            store.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("on", ["dsn", "connection"])
def test_wait_for_async_wakes_on_the_end_without_blocking_the_loop(pg_dsn: str, on: str) -> None:
    [job_id] = enqueue_many(pg_dsn, [JobSpec("k")])
    assert job_id is not None
    finisher = finish_later(pg_dsn, job_id, 1.0)

    async def go() -> tuple[shardworker.JobInfo, int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        ticker = asyncio.create_task(tick())
        try:
            if on == "dsn":
                return await shardworker.wait_for_async(pg_dsn, job_id, 30), ticks
            async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as aconn:
                job = await shardworker.wait_for_async(aconn, job_id, 30)
                listening = await (await aconn.execute("SELECT count(*) FROM pg_listening_channels()")).fetchone()
                assert listening == (0,)  # its connection is left as it was
                return job, ticks
        finally:
            ticker.cancel()

    job, ticks = asyncio.run(go())
    finisher.join(10)
    assert (job.status, job.result) == ("done", {"n": 1})
    assert ticks >= 10  # the loop ran on while it waited about a second


def test_wait_for_async_times_out_and_refuses_what_wait_for_refuses(pg_dsn: str) -> None:
    [job_id] = enqueue_many(pg_dsn, [JobSpec("k")])
    assert job_id is not None
    with pytest.raises(shardworker.WaitTimeout, match=f"job {job_id} is still queued after 0.3s"):
        asyncio.run(shardworker.wait_for_async(pg_dsn, job_id, 0.3))
    with pytest.raises(shardworker.JobsError, match="no job 999999"):
        asyncio.run(shardworker.wait_for_async(pg_dsn, 999999, 1))
    with pytest.raises(shardworker.JobsError, match="timeout_s"):
        asyncio.run(shardworker.wait_for_async(pg_dsn, job_id, -1))


def test_each_wait_names_the_right_call_for_the_other_kind_of_connection(pg_dsn: str) -> None:
    async def sync_wait_on_async_connection() -> None:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as aconn:
            shardworker.wait_for(aconn, 1, 1)

    with pytest.raises(shardworker.JobsError, match=re.escape("await shardworker.wait_for_async(")):
        asyncio.run(sync_wait_on_async_connection())
    with psycopg.connect(pg_dsn) as conn, pytest.raises(shardworker.JobsError,
                                                         match=re.escape("shardworker.wait_for(")):
        asyncio.run(shardworker.wait_for_async(conn, 1, 1))


def test_every_exception_the_docs_name_imports_from_shardworker() -> None:
    texts = [(REPO / "README.md").read_text(), *(p.read_text() for p in (REPO / "docs").glob("*.md"))]
    named = {m for text in texts for m in re.findall(r"`(?:shardworker\.)?([A-Z]\w*(?:Error|Timeout))`", text)}
    named -= set(dir(builtins))  # Python's own (TimeoutError, TypeError)
    assert {"WaitTimeout", "EnqueueError", "ConfigError", "StepError"} <= named
    missing = sorted(name for name in named if not isinstance(getattr(shardworker, name, None), type))
    assert not missing, f"named in the docs, not importable from shardworker: {missing}"
    assert issubclass(shardworker.WaitTimeout, TimeoutError)
    assert issubclass(shardworker.WaitTimeout, shardworker.JobsError)
    assert issubclass(shardworker.EnqueueError, shardworker.ShardworkerError)
