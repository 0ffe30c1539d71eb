"""``shardworker.testing.record_enqueued`` on a real PostgreSQL: the jobs enqueued while the
block runs (by any means: enqueue, enqueue_many with COPY, after=, another connection), none
from before; picked by kind, queue and payload; on the caller's connection it sees the jobs
of its open transaction."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from shardworker import JobSpec, enqueue, enqueue_async, enqueue_many
from shardworker.testing import record_enqueued


def test_it_records_the_jobs_enqueued_in_the_block_only(pg_dsn: str) -> None:
    before = enqueue(pg_dsn, "email", {"to": "old@example.com"})
    with record_enqueued(pg_dsn) as enqueued:
        first = enqueue(pg_dsn, "email", {"to": "a@example.com", "lang": "fr"}, queue="mail")
        enqueue_many(pg_dsn, [JobSpec("resize", {"w": 10}), JobSpec("resize", {"w": 20}, "images")])
        asyncio.run(enqueue_async(pg_dsn, "index", None, after=[first]))  # type: ignore[list-item]
    enqueue(pg_dsn, "email", {"to": "late@example.com"})
    assert before not in enqueued.ids and len(enqueued) == 4
    assert enqueued.kinds() == ["email", "resize", "resize", "index"]
    assert enqueued.ids == [job.id for job in enqueued]
    [email] = enqueued.filter(kind="email")
    assert (email.id, email.queue, email.status) == (first, "mail", "queued")
    assert enqueued.one(payload={"to": "a@example.com"}) == email  # a payload matches on the keys given
    assert [j.payload for j in enqueued.filter(kind="resize", queue="images")] == [{"w": 20}]
    assert [j.payload["w"] for j in enqueued.filter(payload=lambda p: isinstance(p, dict) and p.get("w", 0) > 5)] == [
        10, 20]
    assert enqueued.one(kind="index").status == "waiting"
    assert enqueued.filter(kind="nothing") == []


def test_one_says_what_it_found_when_it_is_not_exactly_one(pg_dsn: str) -> None:
    with record_enqueued(pg_dsn) as enqueued:
        enqueue_many(pg_dsn, [JobSpec("a"), JobSpec("a")])
    with pytest.raises(AssertionError, match=r"2 jobs match kind='a': ids \[\d+, \d+\]"):
        enqueued.one(kind="a")
    with pytest.raises(AssertionError, match="no job matches kind='b' among 2 enqueued: a, a"):
        enqueued.one(kind="b")


def test_on_the_callers_connection_it_sees_its_open_transaction(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        with conn.transaction(), record_enqueued(conn) as enqueued:
            enqueue(conn, "email", {"to": "x"})
            enqueued.refresh()  # read now, inside the transaction
            assert enqueued.kinds() == ["email"]
        assert enqueued.kinds() == ["email"]


def test_a_rolled_back_enqueue_is_not_recorded(pg_dsn: str) -> None:
    with record_enqueued(pg_dsn) as enqueued, psycopg.connect(pg_dsn) as conn:
        with pytest.raises(ZeroDivisionError), conn.transaction():
            enqueue(conn, "email")
            raise ZeroDivisionError
        enqueue(pg_dsn, "kept")
    assert enqueued.kinds() == ["kept"]
