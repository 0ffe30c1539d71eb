"""PgStore on a real PostgreSQL: enqueue, notifications, outages, and the rescuer. Outage
tests get a server of their own (``private_pg``)."""

from __future__ import annotations

import concurrent.futures
import logging
from datetime import UTC, datetime, timedelta

import pytest

from shardworker.errors import DatabaseUnavailable, EnqueueError, ShardworkerError
from shardworker.retry import is_retryable
from shardworker.store.embedded import EmbeddedPostgres
from shardworker.store.pg_store import PgStore, StoreConfig
from shardworker.views import Serving
from shardworker.worker.rescuer import Rescuer
from tests.helpers import query, wait_for
from tests.store.support import add, add_id, claim_one, connect, count_jobs, done, row

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


# --- rescuer ---------------------------------------------------------------------------------


def beat(store: PgStore, worker: str) -> None:
    store.heartbeat(worker, "host", 1)


def test_rescuer_requeues_jobs_of_a_worker_watched_silent(store: PgStore, other: PgStore, pg_dsn: str) -> None:
    """A worker whose heartbeat stays unchanged for rescue_after while watched gets its running jobs requeued."""
    dead_job, alive_job, own_job = add_id(store, "d"), add_id(store, "a"), add_id(store, "m")
    other.claim(["d"], None, "w-dead", 10)
    other.claim(["a"], None, "w-alive", 10)
    other.claim(["m"], None, "w-me", 10)
    for worker in ("w-dead", "w-alive", "w-me"):
        beat(other, worker)
    rescuer = Rescuer(store, "w-me", rescue_after_s=10.0)
    for now in (0.0, 5.0, 9.9):
        beat(other, "w-alive")
        assert rescuer.run_once(now) == []
    beat(other, "w-alive")
    assert rescuer.run_once(10.0) == [dead_job]
    r = row(pg_dsn, dead_job)
    assert (r["status"], r["locked_by"]) == ("queued", None)
    assert "w-dead" in r["last_error"]
    assert set(store.heartbeats()) == {"w-alive", "w-me"}
    assert row(pg_dsn, alive_job)["status"] == row(pg_dsn, own_job)["status"] == "running"
    for now in (50.0, 100.0):
        beat(other, "w-alive")
        assert rescuer.run_once(now) == []  # its own unchanged heartbeat never rescues itself
    assert row(pg_dsn, own_job)["status"] == "running"


def test_rescuer_forgets_observations_after_connection_lost(store: PgStore, other: PgStore, pg_dsn: str) -> None:
    """After connection_lost nobody is rescued until rescue_after of fresh observation has passed."""
    job_id = add_id(store)
    other.claim(["k"], None, "w-dead", 10)
    beat(other, "w-dead")
    rescuer = Rescuer(store, "w-me", rescue_after_s=10.0)
    assert rescuer.run_once(0.0) == []
    assert rescuer.run_once(9.0) == []
    rescuer.connection_lost()
    assert rescuer.run_once(12.0) == []  # 12 s after first sight, but only 0 s since the outage
    assert rescuer.run_once(21.9) == []
    assert row(pg_dsn, job_id)["status"] == "running"
    assert rescuer.run_once(22.0) == [job_id]


def test_rescuer_restarts_the_clock_when_a_heartbeat_changes(store: PgStore, other: PgStore) -> None:
    """A worker that beats again before rescue_after is watched afresh, not rescued."""
    add_id(store)
    other.claim(["k"], None, "w-slow", 10)
    beat(other, "w-slow")
    rescuer = Rescuer(store, "w-me", rescue_after_s=10.0)
    assert rescuer.run_once(0.0) == []
    beat(other, "w-slow")
    assert rescuer.run_once(9.0) == []
    assert rescuer.run_once(18.0) == []
    assert rescuer.run_once(19.0) != []


def test_two_rescuers_watching_one_silent_worker_rescue_it_once(
        store: PgStore, other: PgStore, pg_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """No lock picks a rescuer (a frozen holder would keep it for good): two workers watch the
    same silent one. The first to act requeues its job (one failed attempt) and says so; the
    second finds its row gone, requeues nothing and says nothing."""
    job_id = add_id(store)
    store.claim(["k"], None, "w-dead", 10)
    beat(store, "w-dead")
    first, second = Rescuer(store, "w-1", 10.0), Rescuer(other, "w-2", 10.0)
    beat(store, "w-1")
    beat(other, "w-2")  # each rescuer runs after its own worker's beat, on the same session
    assert first.run_once(0.0) == [] and second.run_once(0.0) == []
    beat(store, "w-1")
    beat(other, "w-2")
    with caplog.at_level(logging.WARNING):
        assert second.run_once(10.0) == [job_id]
        assert first.run_once(10.0) == []
    assert [r.getMessage() for r in caplog.records if "rescued" in r.getMessage()] == [
        "rescued 1 jobs of silent workers w-dead (claimable again in 0s)"]
    r = row(pg_dsn, job_id)
    assert (r["status"], r["attempt"], r["rescued_attempt"], len(r["errors"])) == ("queued", 1, 1, 1)


def test_concurrent_rescues_of_one_worker_requeue_its_jobs_once(store: PgStore, other: PgStore, pg_dsn: str) -> None:
    """The same rescue from two sessions at once: both wait on the silent worker's row (locked
    here meanwhile), then one deletes it and the other, its DELETE rechecking the row, finds it
    gone; the jobs are requeued once."""
    job_id = add_id(store)
    store.claim(["k"], None, "w-dead", 10)
    beat(store, "w-dead")
    observed = [("w-dead", store.heartbeats()["w-dead"])]
    with connect(pg_dsn) as holder, concurrent.futures.ThreadPoolExecutor(2) as pool:
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM shardworker.workers WHERE worker_id = 'w-dead' FOR UPDATE")
        futures = [pool.submit(s.rescue_workers, observed) for s in (store, other)]
        wait_for(lambda: waiting_on_locks(pg_dsn) == 2, 10, "both rescues waiting on the row")
        holder.execute("COMMIT")
        results = [f.result(10) for f in futures]
    assert sorted(results) == [((), []), (("w-dead",), [job_id])]
    assert row(pg_dsn, job_id)["errors"][-1]["attempt"] == 1 and len(row(pg_dsn, job_id)["errors"]) == 1


def test_a_worker_is_rescued_only_after_its_own_rescue_window_too(store: PgStore, other: PgStore, pg_dsn: str) -> None:
    """Without a lock every worker rescues: a peer started with a short --rescue-after (say, one
    debugging against production) must not rescue a worker whose own window is longer. The
    longer of the two windows counts (the silent worker's is in its row)."""
    job_id = add_id(store)
    other.claim(["k"], None, "w-prod", 10)
    other.heartbeat("w-prod", "host", 1, serves=Serving(("k",), None, 3600.0))
    beat(store, "w-debug")
    rescuer = Rescuer(store, "w-debug", rescue_after_s=10.0)
    assert rescuer.run_once(0.0) == []
    assert rescuer.run_once(11.0) == []  # its own window passed, not w-prod's
    assert rescuer.run_once(3599.0) == []
    assert row(pg_dsn, job_id)["status"] == "running"
    assert rescuer.run_once(3600.0) == [job_id]


def test_a_rescuer_paused_longer_than_its_heartbeats_watches_afresh(store: PgStore, other: PgStore,
                                                                     pg_dsn: str) -> None:
    """A host paused (SIGSTOP, a VM suspended) keeps its sessions; on resume its rescuer must not
    count the pause as watched silence: peers paused with it, or cut off from it, have not had
    their chance to beat. A gap between two looks longer than max_gap_s starts the watch again."""
    job_id = add_id(store)
    other.claim(["k"], None, "w-peer", 10)
    beat(other, "w-peer")
    beat(store, "w-me")
    rescuer = Rescuer(store, "w-me", rescue_after_s=60.0, max_gap_s=6.0)
    assert rescuer.run_once(0.0) == []
    assert rescuer.run_once(120.0) == []  # paused for 120 s: not 120 s of watching
    assert row(pg_dsn, job_id)["status"] == "running"
    for now in range(122, 180, 2):
        assert rescuer.run_once(float(now)) == []
    assert rescuer.run_once(180.0) == [job_id]


def test_rescuer_rescues_nobody_right_after_its_store_reconnected(private_pg: EmbeddedPostgres) -> None:
    """When the rescuer's store lost its session (server restart), earlier observations prove nothing."""
    store = PgStore(StoreConfig(dsn=private_pg.dsn, connect_timeout_s=2))
    try:
        add_id(store)
        store.claim(["k"], None, "w-dead", 10)
        beat(store, "w-dead")
        rescuer = Rescuer(store, "w-me", rescue_after_s=10.0)
        assert rescuer.run_once(0.0) == []
        private_pg.stop("immediate")  # a full outage: nobody can beat
        with pytest.raises(DatabaseUnavailable):
            store.claim(["k"], None, "w-me", 10)  # the dispatcher's claim notices it first
        private_pg.start()
        store.claim(["k"], None, "w-me", 10)  # and reconnects the shared store
        assert rescuer.run_once(60.0) == []
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


def waiting_on_locks(dsn: str) -> int:
    return int(query(dsn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                          "AND wait_event_type = 'Lock'")[0][0])
