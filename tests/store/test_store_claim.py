"""PgStore on a real PostgreSQL: claiming jobs by kind, queue, due time and priority, never the
same job twice, skipping locked rows.
Every test gets a fresh migrated database (``pg_dsn``)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import psycopg

from shardworker.core.model import ClaimedJob
from shardworker.store.pg_store import PgStore, StoreConfig
from tests.store.support import add_id, claim_one, connect, row


def test_claim_marks_job_running_for_this_worker(store: PgStore, pg_dsn: str) -> None:
    """A claim sets status running, attempt + 1, locked_by and attempted_at, and returns the job."""
    job_id = add_id(store, "k", payload='{"a": [1, 2]}', queue="q1", max_attempts=4)
    assert row(pg_dsn, job_id)["attempt"] == 0
    [job] = store.claim(["k"], None, "worker-a", 10)
    assert job == ClaimedJob(job_id, "k", "q1", job.payload_json, 1, 4, uid=row(pg_dsn, job_id)["uid"])
    assert job.to_job().payload == {"a": [1, 2]}
    r = row(pg_dsn, job_id)
    assert (r["status"], r["attempt"], r["locked_by"]) == ("running", 1, "worker-a")
    assert r["attempted_at"] is not None
    assert store.claim(["k"], None, "worker-a", 10) == []


def test_claim_only_returns_requested_kinds(store: PgStore) -> None:
    """Jobs of kinds the worker has no handler for are left queued."""
    a, b = add_id(store, "a"), add_id(store, "b")
    assert [j.id for j in store.claim(["a", "zzz"], None, "w1", 10)] == [a]
    assert [j.id for j in store.claim(["b"], None, "w1", 10)] == [b]


def test_claim_respects_queues(store: PgStore) -> None:
    """With queues given only those queues are claimed; without, every queue is."""
    q1, q2, q3 = (add_id(store, queue=q) for q in ("q1", "q2", "q3"))
    assert {j.id for j in store.claim(["k"], ["q1", "q2"], "w1", 10)} == {q1, q2}
    assert [j.id for j in store.claim(["k"], None, "w1", 10)] == [q3]


def test_claim_skips_jobs_not_yet_due(store: PgStore, pg_dsn: str) -> None:
    """A job whose run_at is in the future is not claimed until run_at has passed."""
    later = add_id(store, delay_s=3600)
    future = add_id(store, run_at=datetime.now(UTC) + timedelta(hours=1))
    past = add_id(store, run_at=datetime.now(UTC) - timedelta(minutes=1))
    assert 3500 < row(pg_dsn, later)["due_in_s"] <= 3600
    assert [j.id for j in store.claim(["k"], None, "w1", 10)] == [past]
    with connect(pg_dsn) as conn:
        conn.execute("UPDATE shardworker.jobs SET run_at = now() - interval '1 second' WHERE id = %s", (future,))
    assert [j.id for j in store.claim(["k"], None, "w1", 10)] == [future]


def test_claim_orders_by_priority_then_run_at_then_id(store: PgStore) -> None:
    """Smaller priority first; among equals, earlier run_at, then smaller id."""
    now = datetime.now(UTC)
    low = add_id(store, priority=5, run_at=now - timedelta(hours=2))
    newer = add_id(store, priority=0, run_at=now - timedelta(minutes=1))
    older = add_id(store, priority=0, run_at=now - timedelta(minutes=5))
    urgent = add_id(store, priority=-1, run_at=now - timedelta(seconds=1))
    same_a = add_id(store, priority=1, run_at=now - timedelta(minutes=3))
    same_b = add_id(store, priority=1, run_at=now - timedelta(minutes=3))
    claimed = [claim_one(store).id for _ in range(6)]
    assert claimed == [urgent, older, newer, same_a, same_b, low]


def test_claim_returns_at_most_limit_jobs(store: PgStore) -> None:
    """A claim never returns more than its limit."""
    for _ in range(5):
        add_id(store)
    assert len(store.claim(["k"], None, "w1", 3)) == 3
    assert len(store.claim(["k"], None, "w1", 3)) == 2


def test_claim_skips_rows_locked_by_another_transaction(store: PgStore, pg_dsn: str) -> None:
    """A row locked elsewhere is skipped at once (SKIP LOCKED), not waited for."""
    ids = [add_id(store) for _ in range(3)]
    with psycopg.connect(pg_dsn) as holder:  # a transaction that keeps ids[0] locked
        holder.execute("SELECT id FROM shardworker.jobs WHERE id = %s FOR UPDATE", (ids[0],))
        # Waiting for the lock would end in the store's 5 s statement timeout (an error), not jobs.
        claimed = store.claim(["k"], None, "w1", 10)
        assert sorted(j.id for j in claimed) == ids[1:]
        holder.rollback()
    assert [j.id for j in store.claim(["k"], None, "w1", 10)] == [ids[0]]


def test_concurrent_claims_never_return_the_same_job(pg_dsn: str) -> None:
    """Four stores claiming in threads at once split 400 jobs with no job claimed twice."""
    seed = PgStore(StoreConfig(dsn=pg_dsn))
    rows = [("k", "default", "null", 0, 25, None, None)] * 400
    assert None not in seed.enqueue_many(rows)
    seed.close()
    stores = [PgStore(StoreConfig(dsn=pg_dsn)) for _ in range(4)]
    claimed: list[list[int]] = [[] for _ in stores]
    barrier = threading.Barrier(len(stores))

    def worker(index: int) -> None:
        barrier.wait()
        while jobs := stores[index].claim(["k"], None, f"w{index}", 7):
            claimed[index].extend(j.id for j in jobs)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for s in stores:
        s.close()
    everything = [job_id for ids in claimed for job_id in ids]
    assert len(everything) == 400
    assert len(set(everything)) == 400
    assert sum(1 for ids in claimed if ids) >= 2  # the claims really interleaved
    with connect(pg_dsn) as conn:
        attempts = conn.execute("SELECT DISTINCT attempt FROM shardworker.jobs").fetchall()
    assert attempts == [(1,)]
