"""Durable waits in the database (migration 0025) where they meet other transactions: events
sent by a transaction begun before the waiting job existed, or by one whose snapshot predates
the wait, or left open while a wait begins; a second wait on the same key; a handler's send
after its event was pruned; a deleted dependency of a sleeping job; big integers; progress of
a later attempt from a host whose clock is behind. Each drives the worker's own apply
(``PgStore.apply_outcomes``, ``apply_progress``) and the housekeeping's calls."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import psycopg

import shardworker
from shardworker import jobs
from shardworker.core.model import ClaimedJob, Outcome, ProgressRecord, dumps_exact
from shardworker.store.pg_store import PgStore
from tests.helpers import enqueue, execute, query


def claim_one(store: PgStore, kind: str) -> ClaimedJob:
    (job,) = store.claim([kind], None, "w1", 1)
    return job


def suspend(store: PgStore, job: ClaimedJob, wait: dict[str, Any], events: list[Any] | None = None) -> None:
    """Apply the outcome of a run that reached ``wait`` (and sent ``events``), as the flusher does."""
    extras: dict[str, Any] = {"wait": wait}
    if events:
        extras["events"] = events
    result = store.apply_outcomes([Outcome.suspended(job.id, job.attempt, dumps_exact(extras)).claimed_by(job)])
    assert result.applied == 1


def event_wait(name: str, key: str) -> dict[str, Any]:
    return {"kind": "event", "name": name, "key": key, "until": None}


def status(dsn: str, job_id: int) -> str:
    return query(dsn, "SELECT status FROM shardworker.jobs WHERE id = %s", job_id)[0][0]


def step(dsn: str, job_id: int, name: str) -> Any:
    rows = query(dsn, "SELECT result FROM shardworker.job_steps WHERE job_id = %s AND name = %s", job_id, name)
    return rows[0][0] if rows else None


def test_an_event_from_a_transaction_begun_before_the_job_existed_is_taken(pg_dsn: str, store: PgStore) -> None:
    with psycopg.connect(pg_dsn) as sender:
        sender.execute("SELECT 1")  # its transaction, and its now(), begin here
        time.sleep(0.05)
        (job_id,) = enqueue(pg_dsn, "approval", 1)
        job = claim_one(store, "approval")
        assert shardworker.send_event(sender, "order:1", "yes") == 0  # the job does not wait yet
        sender.commit()
    suspend(store, job, event_wait("approval", "order:1"))
    assert status(pg_dsn, job_id) == "queued"
    assert step(pg_dsn, job_id, "approval")["event"] == "yes"


def test_an_event_sent_from_an_older_snapshot_is_caught_by_the_housekeeping_net(pg_dsn: str, store: PgStore) -> None:
    """REPEATABLE READ: the sender's update cannot see the wait begun after its snapshot."""
    (job_id,) = enqueue(pg_dsn, "approval", 1)
    job = claim_one(store, "approval")
    with psycopg.connect(pg_dsn) as sender:
        sender.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        sender.execute("SELECT 1")  # the snapshot
        suspend(store, job, event_wait("approval", "order:2"))
        assert shardworker.send_event(sender, "order:2", "late") == 0
        sender.commit()
    assert status(pg_dsn, job_id) == "waiting"
    assert store.wake_sent(3600, 1000) == 1
    assert status(pg_dsn, job_id) == "queued" and step(pg_dsn, job_id, "approval")["event"] == "late"
    assert store.wake_sent(3600, 1000) == 0


def test_an_open_senders_transaction_holds_up_no_wait(pg_dsn: str, store: PgStore) -> None:
    """An application sends inside a transaction it keeps open: a worker's apply of a wait on
    the same key goes through at once (no lock on the key), and the event, once committed, ends
    the wait through the net."""
    (job_id,) = enqueue(pg_dsn, "approval", 1)
    job = claim_one(store, "approval")
    execute(pg_dsn, "ALTER DATABASE " + query(pg_dsn, "SELECT current_database()")[0][0]
            + " SET statement_timeout = '2s'")
    with psycopg.connect(pg_dsn) as sender:
        sender.execute("SELECT 1")  # its transaction is open: the send joins it
        shardworker.send_event(sender, "order:3", "open")
        started = time.monotonic()
        suspend(store, job, event_wait("approval", "order:3"))
        assert time.monotonic() - started < 1.0
        sender.commit()
    assert status(pg_dsn, job_id) == "waiting"
    assert store.wake_sent(3600, 1000) == 1 and step(pg_dsn, job_id, "approval")["event"] == "open"


def test_a_second_wait_on_the_same_key_takes_the_next_event(pg_dsn: str, store: PgStore) -> None:
    (job_id,) = enqueue(pg_dsn, "chat", 1)
    suspend(store, claim_one(store, "chat"), event_wait("first", "chat:9"))
    assert shardworker.send_event(pg_dsn, "chat:9", "one") == 1
    suspend(store, claim_one(store, "chat"), event_wait("second", "chat:9"))
    assert status(pg_dsn, job_id) == "waiting"  # "one" is taken already
    assert shardworker.send_event(pg_dsn, "chat:9", "two") == 1
    assert (step(pg_dsn, job_id, "first")["event"], step(pg_dsn, job_id, "second")["event"]) == ("one", "two")
    shardworker.send_event(pg_dsn, "chat:9", "three")  # sent before the third wait: taken by it
    suspend(store, claim_one(store, "chat"), event_wait("third", "chat:9"))
    assert status(pg_dsn, job_id) == "queued" and step(pg_dsn, job_id, "third")["event"] == "three"


def test_a_handlers_send_lands_once_even_after_retention_pruned_its_event(pg_dsn: str, store: PgStore) -> None:
    enqueue(pg_dsn, "sender", 1)
    enqueue(pg_dsn, "listener", 1)
    listener = claim_one(store, "listener")
    sender = claim_one(store, "sender")
    suspend(store, sender, {"kind": "sleep", "name": "nap", "until": time.time()}, [["news", "x", 0]])
    execute(pg_dsn, "DELETE FROM shardworker.events")  # past --event-retention
    suspend(store, listener, event_wait("news", "news"))
    assert store.wake_due(1000) == 1  # the sender's sleep is over
    again = claim_one(store, "sender")
    done = replace(Outcome.done(again.id, again.attempt, b"1"), extras_json=dumps_exact({"events": [["news", "x", 0]]}))
    result = store.apply_outcomes([done.claimed_by(again)])
    assert result.applied == 1
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.events") == [(0,)]  # sent before: not again
    assert status(pg_dsn, listener.id) == "waiting"


def test_deleting_a_done_dependency_leaves_a_sleeping_dependent_asleep(pg_dsn: str, store: PgStore) -> None:
    (dep,) = enqueue(pg_dsn, "first", 1)
    waiter = shardworker.enqueue(pg_dsn, "second", after=[dep])
    first = claim_one(store, "first")
    store.apply_outcomes([Outcome.done(first.id, first.attempt, b"1").claimed_by(first)])
    second = claim_one(store, "second")
    suspend(store, second, {"kind": "sleep", "name": "nap", "until": time.time() + 3600})
    assert jobs.delete(pg_dsn, [dep]) == 1
    assert status(pg_dsn, waiter) == "waiting" and jobs.get_job(pg_dsn, waiter).wait == "sleep"


def test_big_integers_in_a_handlers_event_stay_exact(pg_dsn: str, store: PgStore) -> None:
    enqueue(pg_dsn, "sender", 1)
    job = claim_one(store, "sender")
    events = dumps_exact({"events": [["big", {"n": 2**70}, 0]]})
    done = replace(Outcome.done(job.id, job.attempt, b"1"), extras_json=events)
    store.apply_outcomes([done.claimed_by(job)])
    assert query(pg_dsn, "SELECT payload::text FROM shardworker.events") == [('{"n": 1180591620717411303424}',)]


def test_a_later_attempts_progress_shows_whatever_its_hosts_clock_says(pg_dsn: str, store: PgStore) -> None:
    (job_id,) = enqueue(pg_dsn, "report", 1)
    first = claim_one(store, "report")
    now = time.time()
    store.apply_progress([ProgressRecord(job_id, first.attempt, b'"host A 1/2"', now + 5, first.uid)])
    store.apply_outcomes([Outcome.retry(first.id, first.attempt, "lost", 0.0).claimed_by(first)])
    second = claim_one(store, "report")
    store.apply_progress([ProgressRecord(job_id, second.attempt, b'"host B 1/2"', now, second.uid)])
    assert jobs.get_job(pg_dsn, job_id).progress == "host B 1/2"
    store.apply_progress([ProgressRecord(job_id, second.attempt, b'"host B, replayed"', now - 1, second.uid)])
    assert jobs.get_job(pg_dsn, job_id).progress == "host B 1/2"  # an older report of its attempt: kept out
