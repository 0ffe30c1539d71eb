"""PgStore on a real PostgreSQL: enqueue, notifications and outages (the rescuer: test_rescuer.py). Outage
tests get a server of their own (``private_pg``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shardworker.core.retry import is_retryable
from shardworker.embedded import EmbeddedPostgres
from shardworker.errors import DatabaseUnavailable, EnqueueError, ShardworkerError
from shardworker.store.pg_store import PgStore, StoreConfig
from tests.store.support import add, add_id, claim_one, connect, count_jobs, done

# --- enqueue --------------------------------------------------------------------------------


def test_enqueue_dedupe_key_allows_one_live_job(store: PgStore, pg_dsn: str) -> None:
    """A second enqueue with a live (queued or running) key returns None; after done the key is free."""
    first = add(store, dedupe_key="order-1")
    assert first is not None
    assert add(store, dedupe_key="order-1") is None
    assert add(store, dedupe_key="order-2") is not None
    job = claim_one(store)
    assert job.id == first
    assert add(store, dedupe_key="order-1") is None  # running still holds it
    store.apply_outcomes([done(job)])
    again = add(store, dedupe_key="order-1")
    assert again is not None and again != first
    assert count_jobs(pg_dsn) == 3


def test_enqueue_rejects_a_row_the_database_refuses(store: PgStore, pg_dsn: str) -> None:
    """A job violating a CHECK (max_attempts 0) raises EnqueueError and inserts nothing."""
    with pytest.raises(EnqueueError):
        add(store, max_attempts=0)
    with pytest.raises(EnqueueError):
        add(store, payload="{not json")
    assert count_jobs(pg_dsn) == 0
    assert add(store) is not None  # the connection is still usable


def test_enqueue_many_inserts_every_row(store: PgStore, pg_dsn: str) -> None:
    """COPY enqueue inserts all rows with their fields and returns their ids, and skips live
    dedupe keys (None), within the batch too."""
    run_at = datetime.now(UTC) + timedelta(hours=1)
    rows = [("k", "q1", '{"n": 1}', 3, 2, None, None), ("k", "q2", '"text"', 0, 25, run_at, "key"),
            ("k", "q2", "null", 0, 25, None, "key")]
    ids = store.enqueue_many(rows)
    with connect(pg_dsn) as conn:
        got = conn.execute("SELECT id, queue, payload, priority, max_attempts, run_at > now(), dedupe_key "
                           "FROM shardworker.jobs ORDER BY id").fetchall()
    assert got == [(ids[0], "q1", {"n": 1}, 3, 2, False, None), (ids[1], "q2", "text", 0, 25, True, "key")]
    assert ids[2] is None
    assert store.enqueue_many([("k", "default", "1", 0, 25, None, "key")]) == [None]


def test_enqueue_many_is_all_or_nothing_on_a_check_violation(store: PgStore, pg_dsn: str) -> None:
    """A row violating a CHECK (max_attempts 0) among good rows fails the batch and inserts nothing."""
    rows = [("k", "default", "null", 0, 25, None, None)] * 50
    rows[25] = ("k", "default", "null", 0, 0, None, None)
    with pytest.raises(ShardworkerError, match="max_attempts"):
        store.enqueue_many(rows)
    assert count_jobs(pg_dsn) == 0
    assert len(store.enqueue_many(rows[:3])) == 3  # the connection is still usable


def test_enqueue_many_reports_a_check_violation_as_enqueue_error(store: PgStore) -> None:
    """A row the jobs table refuses is reported as EnqueueError, like a refused single enqueue."""
    with pytest.raises(EnqueueError):
        store.enqueue_many([("k", "default", "null", 0, 0, None, None)])


def test_enqueue_many_is_all_or_nothing_on_bad_json(store: PgStore, pg_dsn: str) -> None:
    """A row whose payload is not JSON fails the COPY with EnqueueError and inserts nothing."""
    rows = [("k", "default", "null", 0, 25, None, None)] * 10
    rows[9] = ("k", "default", "{oops", 0, 25, None, None)
    with pytest.raises(EnqueueError):
        store.enqueue_many(rows)
    assert count_jobs(pg_dsn) == 0


# --- notifications --------------------------------------------------------------------------


def test_wait_notify_wakes_on_enqueue(store: PgStore, other: PgStore) -> None:
    """A listening store is woken by another connection's enqueue, and not woken without one."""
    store.listen()
    assert store.wait_notify(0.2) is False
    add_id(other)
    assert store.wait_notify(5.0) is True
    assert store.wait_notify(0.2) is False  # consumed
    other.enqueue_many([("k", "default", "null", 0, 25, None, None)])
    assert store.wait_notify(5.0) is True


def test_wait_notify_subscribes_on_first_use(store: PgStore, other: PgStore) -> None:
    """wait_notify without an explicit listen subscribes first, then sees later enqueues."""
    assert store.wait_notify(0.05) is False
    add_id(other)
    assert store.wait_notify(5.0) is True


# --- outages --------------------------------------------------------------------------------


def test_database_unavailable_while_stopped_then_reconnects(private_pg: EmbeddedPostgres) -> None:
    """With the server stopped every call raises retryable DatabaseUnavailable; after restart the store reconnects."""
    store = PgStore(StoreConfig(dsn=private_pg.dsn, connect_timeout_s=2, statement_timeout_s=5))
    try:
        job_id = add_id(store)
        private_pg.stop("immediate")
        with pytest.raises(DatabaseUnavailable) as broken:
            store.claim(["k"], None, "w1", 10)  # the open connection is dead
        assert is_retryable(broken.value)
        with pytest.raises(DatabaseUnavailable):
            store.stats()  # a new connection is refused
        private_pg.start()
        assert [j.id for j in store.claim(["k"], None, "w1", 10)] == [job_id]
    finally:
        store.close()


def test_a_name_that_does_not_resolve_is_an_outage() -> None:
    """A DNS name that (for now) does not resolve is waited out like any unreachable database."""
    store = PgStore(StoreConfig(dsn="postgresql://app@db-that-does-not-resolve.invalid:5432/app", connect_timeout_s=2))
    try:
        with pytest.raises(DatabaseUnavailable) as failed:
            store.stats()
        assert is_retryable(failed.value)
    finally:
        store.close()
