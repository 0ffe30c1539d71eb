"""A key per job (a tenant's): every enqueue path stores it (sync and async, one and many,
COPY and after=, a handler's follow-ups, the CLI's --key and "key" in --file lines), the
handler reads it as ``job.key``, and operators find it in ``jobs list`` (``--key``) and
``jobs show``. Real PostgreSQL throughout; the CLI as a subprocess."""

from __future__ import annotations

import asyncio
import json

import orjson
import psycopg
import pytest

from shardworker import App, Job, JobSpec, enqueue, enqueue_async, enqueue_many, enqueue_many_async
from shardworker.core import followups
from shardworker.errors import EnqueueError
from shardworker.testing import run_handler
from tests.cli.test_day_two_cli import sw
from tests.helpers import query


def keys(dsn: str) -> dict[int, str | None]:
    return dict(query(dsn, "SELECT id, key FROM shardworker.jobs"))


def test_every_python_enqueue_path_stores_the_key(pg_dsn: str) -> None:
    one = enqueue(pg_dsn, "k", key="tenant-1")
    waiting = enqueue(pg_dsn, "k", key="tenant-2", after=[one])
    copied = enqueue_many(pg_dsn, [JobSpec("k", key="tenant-3"), JobSpec("k")])
    linked = enqueue_many(pg_dsn, [JobSpec("k", key="tenant-4", after=(one,))])

    async def from_asyncio() -> list[int | None]:
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as aconn:
            return [await enqueue_async(aconn, "k", key="tenant-5"),
                    *(await enqueue_many_async(aconn, [JobSpec("k", key="tenant-6")]))]

    later = asyncio.run(from_asyncio())
    found = keys(pg_dsn)
    assert [found[i] for i in (one, waiting, *copied, *linked, *later)] == [  # type: ignore[index]
        "tenant-1", "tenant-2", "tenant-3", None, "tenant-4", "tenant-5", "tenant-6"]


@pytest.mark.parametrize("bad, why", [("", "key must be a non-empty string"), ("  ", "key must be a non-empty"),
                                      ("x" * 256, "key is 256 bytes"), (42, "key must be a non-empty string")])
def test_a_bad_key_is_refused_before_anything_is_sent(pg_dsn: str, bad: object, why: str) -> None:
    with pytest.raises(EnqueueError, match=why):
        enqueue(pg_dsn, "k", key=bad)  # type: ignore[arg-type]
    assert keys(pg_dsn) == {}


def test_a_handler_reads_its_key_and_gives_it_to_a_follow_up() -> None:
    app = App()

    @app.handler("invoice")
    def invoice(job: Job) -> str | None:
        job.enqueue("email", {"to": "x"}, key=job.key)
        return job.key

    run = run_handler(app, "invoice", key="tenant-9")
    assert run.result == "tenant-9"
    assert [(f.kind, f.key) for f in run.followups] == [("email", "tenant-9")]


def test_follow_ups_recorded_before_keys_still_decode() -> None:
    """An outbox written by a release before keys holds follow-ups of eight fields."""
    old = orjson.dumps([["k", '{"a": 1}', "default", 0, 25, 0.0, None, []]])
    new = orjson.dumps([["k", "null", "default", 0, 25, 0.0, None, [], "tenant-1"]])
    assert [row.key for row in followups.decode(old)] == [None]
    assert [row.key for row in followups.decode(new)] == ["tenant-1"]


def test_the_cli_enqueues_lists_and_shows_keys(pg_dsn: str) -> None:
    sw(pg_dsn, "enqueue", "report", "--key", "acme")
    lines = '{"kind": "report", "key": "globex"}\n{"kind": "report"}\n'
    sw(pg_dsn, "enqueue", "--file", "-", "--key", "initech", stdin=lines)
    assert sorted(k for k in keys(pg_dsn).values() if k) == ["acme", "globex", "initech"]
    listed = sw(pg_dsn, "jobs", "list", "--key", "globex").stdout.splitlines()
    assert len(listed) == 2 and listed[0].split()[4] == "key" and "globex" in listed[1]
    assert "no jobs match" in sw(pg_dsn, "jobs", "list", "--key", "nobody").stderr
    assert "an empty key names no job" in sw(pg_dsn, "jobs", "list", "--key", "", code=2).stderr
    [(acme,)] = query(pg_dsn, "SELECT id FROM shardworker.jobs WHERE key = 'acme'")
    assert "          key: acme" in sw(pg_dsn, "jobs", "show", str(acme)).stdout
    assert json.loads(sw(pg_dsn, "jobs", "show", str(acme), "--json").stdout)["key"] == "acme"
    plain = sw(pg_dsn, "jobs", "list", "--status", "queued").stdout.splitlines()[0]
    assert "key" in plain  # some listed job has one
    refused = sw(pg_dsn, "enqueue", "report", "--key", "", code=1)
    assert "key must be a non-empty string" in refused.stderr and refused.stderr.count("\n") == 1


def test_stats_by_key_lists_the_tenants_with_the_biggest_backlog(pg_dsn: str) -> None:
    enqueue_many(pg_dsn, [JobSpec("k", key="big") for _ in range(5)] + [JobSpec("k", key="small")]
                 + [JobSpec("k") for _ in range(9)])
    later = enqueue(pg_dsn, "k", key="small", delay_s=3600)
    assert later is not None
    lines = sw(pg_dsn, "stats", "--by", "key").stdout.splitlines()
    assert lines[0].split() == ["key", "available", "scheduled", "claimed", "oldest"]
    assert [line.split()[:4] for line in lines[1:]] == [["big", "5", "0", "0"], ["small", "1", "1", "0"]]
    rows = json.loads(sw(pg_dsn, "stats", "--by", "key", "--limit", "1", "--json").stdout)
    assert [(r["key"], r["available"]) for r in rows] == [("big", 5)]
