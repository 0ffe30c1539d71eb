"""PgStore on a real PostgreSQL: schema, claiming, fenced outcomes, enqueue, notifications,
outages, and the rescuer. Every test gets a fresh migrated database (``pg_dsn``); outage
tests get a server of their own (``private_pg``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from shardworker.embedded import EmbeddedPostgres
from shardworker.errors import DatabaseUnavailable, EnqueueError, SchemaMissing, ShardworkerError
from shardworker.model import ApplyResult, ClaimedJob, Outcome
from shardworker.pg_store import PgStore, StoreConfig, available_migrations
from shardworker.rescuer import Rescuer
from shardworker.retry import is_retryable

# --- helpers ------------------------------------------------------------------------------


def connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True, connect_timeout=5)


def row(dsn: str, job_id: int) -> dict[str, Any]:
    """The job's row, with ``due_in_s`` = run_at - now() in seconds."""
    with connect(dsn) as conn, conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT *, extract(epoch FROM run_at - now())::float8 AS due_in_s "
                    "FROM shardworker.jobs WHERE id = %s", (job_id,))
        found = cur.fetchone()
    assert found is not None, f"job {job_id} not found"
    return found


def count_jobs(dsn: str) -> int:
    with connect(dsn) as conn:
        found = conn.execute("SELECT count(*) FROM shardworker.jobs").fetchone()
    assert found is not None
    return int(found[0])


def add(store: PgStore, kind: str = "k", payload: str = "null", *, queue: str = "default", priority: int = 0,
        max_attempts: int = 25, run_at: datetime | None = None, delay_s: float = 0.0,
        dedupe_key: str | None = None) -> int | None:
    return store.enqueue(kind, payload, queue=queue, priority=priority, max_attempts=max_attempts,
                         run_at=run_at, delay_s=delay_s, dedupe_key=dedupe_key)


def add_id(store: PgStore, kind: str = "k", **options: Any) -> int:
    job_id = add(store, kind, **options)
    assert job_id is not None
    return job_id


def claim_one(store: PgStore, worker: str = "w1", kinds: tuple[str, ...] = ("k",)) -> ClaimedJob:
    jobs = store.claim(list(kinds), None, worker, 1)
    assert len(jobs) == 1
    return jobs[0]


def done(job: ClaimedJob, result: str = '{"ok": true}') -> Outcome:
    return Outcome(job.id, job.attempt, True, result_json=result)


def failure(job: ClaimedJob, delay_s: float, error: str = "boom") -> Outcome:
    return Outcome(job.id, job.attempt, False, error=error, retry_delay_s=delay_s)


@pytest.fixture
def store(pg_dsn: str) -> Iterator[PgStore]:
    s = PgStore(StoreConfig(pg_dsn, connect_timeout_s=3, statement_timeout_s=5))
    yield s
    s.close()


@pytest.fixture
def other(pg_dsn: str) -> Iterator[PgStore]:
    """A second store on the same database: another worker's connection."""
    s = PgStore(StoreConfig(pg_dsn, connect_timeout_s=3, statement_timeout_s=5))
    yield s
    s.close()


# --- schema -------------------------------------------------------------------------------


def test_migrate_applies_every_file_once_then_nothing(empty_dsn: str) -> None:
    """The first migrate applies every migration in order; the second applies none and changes nothing."""
    store = PgStore(StoreConfig(empty_dsn))
    try:
        expected = [path.name for _, path in available_migrations()]
        assert expected[:2] == ["0001_create_jobs.sql", "0002_create_workers.sql"]
        assert store.migrate() == expected
        assert store.migrate() == []
        store.check_schema()
    finally:
        store.close()
    with connect(empty_dsn) as conn:
        ledger = conn.execute("SELECT version, name FROM shardworker.migrations ORDER BY version").fetchall()
    assert [name for _, name in ledger] == expected


def test_migrate_on_migrated_database_applies_nothing(store: PgStore, pg_dsn: str) -> None:
    """Migrating an up-to-date database is a no-op that keeps existing jobs."""
    job_id = add_id(store)
    assert store.migrate() == []
    assert row(pg_dsn, job_id)["status"] == "queued"


def test_check_schema_raises_schema_missing_on_empty_database(empty_dsn: str) -> None:
    """check_schema (and any query) raises SchemaMissing when the schema was never created."""
    store = PgStore(StoreConfig(empty_dsn))
    try:
        with pytest.raises(SchemaMissing):
            store.check_schema()
        with pytest.raises(SchemaMissing):
            store.claim(["k"], None, "w1", 10)
    finally:
        store.close()


def test_check_schema_raises_when_schema_was_dropped(store: PgStore, pg_dsn: str) -> None:
    """Dropping the shardworker schema makes check_schema raise SchemaMissing."""
    store.check_schema()
    with connect(pg_dsn) as conn:
        conn.execute("DROP SCHEMA shardworker CASCADE")
    with pytest.raises(SchemaMissing):
        store.check_schema()


def test_check_schema_raises_when_ledger_is_behind(store: PgStore, pg_dsn: str) -> None:
    """A ledger missing the newest migration raises SchemaMissing naming both versions."""
    latest = max(v for v, _ in available_migrations())
    with connect(pg_dsn) as conn:
        conn.execute("DELETE FROM shardworker.migrations WHERE version = %s", (latest,))
    with pytest.raises(SchemaMissing) as info:
        store.check_schema()
    assert f"version {latest - 1}" in str(info.value)
    assert f"needs {latest}" in str(info.value)


# --- claiming -----------------------------------------------------------------------------


def test_claim_marks_job_running_for_this_worker(store: PgStore, pg_dsn: str) -> None:
    """A claim sets status running, attempt + 1, locked_by and attempted_at, and returns the job."""
    job_id = add_id(store, "k", payload='{"a": [1, 2]}', queue="q1", max_attempts=4)
    assert row(pg_dsn, job_id)["attempt"] == 0
    [job] = store.claim(["k"], None, "worker-a", 10)
    assert job == ClaimedJob(job_id, "k", "q1", job.payload_json, 1, 4)
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
        started = time.monotonic()
        claimed = store.claim(["k"], None, "w1", 10)
        assert time.monotonic() - started < 2.0
        assert sorted(j.id for j in claimed) == ids[1:]
        holder.rollback()
    assert [j.id for j in store.claim(["k"], None, "w1", 10)] == [ids[0]]


def test_concurrent_claims_never_return_the_same_job(pg_dsn: str) -> None:
    """Four stores claiming in threads at once split 400 jobs with no job claimed twice."""
    seed = PgStore(StoreConfig(pg_dsn))
    rows = [("k", "default", "null", 0, 25, None, None)] * 400
    assert seed.enqueue_many(rows) == 400
    seed.close()
    stores = [PgStore(StoreConfig(pg_dsn)) for _ in range(4)]
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


# --- applying outcomes --------------------------------------------------------------------


def test_apply_success_marks_done_with_result(store: PgStore, pg_dsn: str) -> None:
    """A successful outcome sets done, stores the result, clears locked_by and sets finished_at."""
    job = (add_id(store), claim_one(store))[1]
    assert store.apply_outcomes([done(job, '{"bytes": 123}')]) == ApplyResult(applied=1)
    r = row(pg_dsn, job.id)
    assert (r["status"], r["result"], r["locked_by"], r["attempt"]) == ("done", {"bytes": 123}, None, 1)
    assert r["finished_at"] is not None


def test_apply_failure_requeues_with_delay_while_attempts_remain(store: PgStore, pg_dsn: str) -> None:
    """A failure with attempts left requeues the job, run_at moved by the delay, error kept."""
    add_id(store, max_attempts=3)
    job = claim_one(store)
    assert store.apply_outcomes([failure(job, 30.0, "ValueError: bad input")]).applied == 1
    r = row(pg_dsn, job.id)
    assert (r["status"], r["attempt"], r["locked_by"]) == ("queued", 1, None)
    assert r["last_error"] == "ValueError: bad input"
    assert r["finished_at"] is None
    assert 25.0 < r["due_in_s"] <= 30.0
    assert store.claim(["k"], None, "w1", 10) == []  # not due yet


def test_apply_failure_at_max_attempts_marks_failed(store: PgStore, pg_dsn: str) -> None:
    """The failure of the last allowed attempt marks the job failed."""
    add_id(store, max_attempts=2)
    first = claim_one(store)
    store.apply_outcomes([failure(first, 0.0, "first")])
    assert row(pg_dsn, first.id)["status"] == "queued"
    second = claim_one(store)
    assert second.attempt == 2
    store.apply_outcomes([failure(second, 0.0, "second")])
    r = row(pg_dsn, first.id)
    assert (r["status"], r["attempt"], r["last_error"]) == ("failed", 2, "second")
    assert r["finished_at"] is not None
    assert store.claim(["k"], None, "w1", 10) == []


def test_apply_failure_with_negative_delay_fails_at_once(store: PgStore, pg_dsn: str) -> None:
    """A failure whose delay is -1 marks the job failed even with attempts left."""
    add_id(store, max_attempts=10)
    job = claim_one(store)
    store.apply_outcomes([failure(job, -1, "permanent")])
    r = row(pg_dsn, job.id)
    assert (r["status"], r["attempt"], r["last_error"]) == ("failed", 1, "permanent")
    assert r["finished_at"] is not None


def test_apply_outcome_of_an_older_attempt_is_stale(store: PgStore, other: PgStore, pg_dsn: str) -> None:
    """After a job is rescued and re-claimed, the old attempt's outcome is stale and overwrites nothing."""
    add_id(store)
    old = claim_one(store, "w-old")
    assert store.rescue_workers(["w-old"]) == [old.id]
    new = claim_one(other, "w-new")
    assert new.attempt == old.attempt + 1
    result = store.apply_outcomes([done(old, '{"from": "old"}')])
    assert result == ApplyResult(applied=0, replayed=0, stale=1, stale_ids=(old.id,))
    r = row(pg_dsn, old.id)
    assert (r["status"], r["attempt"], r["locked_by"], r["result"]) == ("running", 2, "w-new", None)
    assert other.apply_outcomes([done(new, '{"from": "new"}')]) == ApplyResult(applied=1)
    assert row(pg_dsn, old.id)["result"] == {"from": "new"}


def test_apply_outcome_after_rescue_before_reclaim_is_stale(store: PgStore, pg_dsn: str) -> None:
    """An outcome for an attempt that was rescued (not yet re-claimed) is stale: it was never applied."""
    add_id(store)
    job = claim_one(store, "w-old")
    store.rescue_workers(["w-old"])
    result = store.apply_outcomes([done(job)])
    assert row(pg_dsn, job.id)["status"] == "queued"  # not applied: the fence held
    assert result == ApplyResult(stale=1, stale_ids=(job.id,))


def test_applying_an_outcome_twice_is_a_replay(store: PgStore, pg_dsn: str) -> None:
    """A second apply of the same attempt's outcome, even with another result, changes nothing."""
    add_id(store)
    job = claim_one(store)
    assert store.apply_outcomes([done(job, '{"v": 1}')]) == ApplyResult(applied=1)
    before = row(pg_dsn, job.id)
    assert store.apply_outcomes([done(job, '{"v": 1}')]) == ApplyResult(replayed=1)
    assert store.apply_outcomes([done(job, '{"v": 2}'), failure(job, -1.0)]) == ApplyResult(replayed=2)
    after = row(pg_dsn, job.id)
    assert {k: v for k, v in after.items() if k != "due_in_s"} == {k: v for k, v in before.items()
                                                                   if k != "due_in_s"}


def test_apply_batch_classifies_applied_replayed_and_stale(store: PgStore, pg_dsn: str) -> None:
    """One batch applies the live outcome, counts the replay and reports the unknown job as stale."""
    add_id(store)
    add_id(store)
    finished, live = store.claim(["k"], None, "w1", 2)
    store.apply_outcomes([done(finished)])
    missing = Outcome(10**12, 1, True, result_json="1")
    result = store.apply_outcomes([done(live, "7"), done(finished), missing])
    assert result == ApplyResult(applied=1, replayed=1, stale=1, stale_ids=(10**12,))
    assert row(pg_dsn, live.id)["result"] == 7


def test_apply_batch_accepts_integer_and_float_delays(store: PgStore, pg_dsn: str) -> None:
    """A batch whose delays mix -1 (int) and 0.5 (float) applies both outcomes."""
    add_id(store)
    add_id(store)
    a, b = store.claim(["k"], None, "w1", 2)
    assert store.apply_outcomes([failure(a, -1), failure(b, 0.5)]) == ApplyResult(applied=2)
    assert row(pg_dsn, a.id)["status"] == "failed"


def test_apply_empty_batch_does_nothing(store: PgStore) -> None:
    """An empty batch returns an empty result without touching the database."""
    assert store.apply_outcomes([]) == ApplyResult()


# --- release and orphans ------------------------------------------------------------------


def test_release_undoes_the_claim_only_for_the_claiming_worker(store: PgStore, pg_dsn: str) -> None:
    """Release by another worker does nothing; by the claiming worker it requeues with attempt - 1."""
    add_id(store)
    add_id(store)
    jobs = store.claim(["k"], None, "w1", 10)
    pairs = [(j.id, j.attempt) for j in jobs]
    assert store.release(pairs, "w2") == 0
    assert all(row(pg_dsn, j.id)["status"] == "running" for j in jobs)
    assert store.release([(jobs[0].id, 2)], "w1") == 0  # wrong attempt
    assert store.release(pairs, "w1") == 2
    for j in jobs:
        r = row(pg_dsn, j.id)
        assert (r["status"], r["attempt"], r["locked_by"]) == ("queued", 0, None)
    assert store.release([], "w1") == 0
    assert len(store.claim(["k"], None, "w1", 10)) == 2


def test_release_matches_each_id_with_its_own_attempt(store: PgStore, pg_dsn: str) -> None:
    """release([(a, 1), (b, 2)]) releases nothing when a is at attempt 2 and b at attempt 1."""
    a, b = add_id(store, "a"), add_id(store, "b")
    first = claim_one(store, "w1", ("a",))
    store.apply_outcomes([failure(first, 0.0)])
    assert claim_one(store, "w1", ("a",)).attempt == 2
    assert claim_one(store, "w1", ("b",)).attempt == 1
    assert store.release([(a, 1), (b, 2)], "w1") == 0
    assert row(pg_dsn, a)["status"] == row(pg_dsn, b)["status"] == "running"


def test_requeue_orphans_retries_this_workers_running_jobs(store: PgStore, pg_dsn: str) -> None:
    """This worker's running jobs are requeued (or failed when out of attempts); others' are untouched."""
    retry = add_id(store, "r", max_attempts=3)
    last = add_id(store, "l", max_attempts=1)
    foreign = add_id(store, "f")
    store.claim(["r", "l"], None, "w1", 10)
    store.claim(["f"], None, "w2", 10)
    assert sorted(store.requeue_orphans("w1", "worker restarted")) == sorted([retry, last])
    r = row(pg_dsn, retry)
    assert (r["status"], r["attempt"], r["locked_by"], r["last_error"]) == ("queued", 1, None, "worker restarted")
    r = row(pg_dsn, last)
    assert (r["status"], r["last_error"]) == ("failed", "worker restarted")
    assert r["finished_at"] is not None
    assert row(pg_dsn, foreign)["locked_by"] == "w2"
    assert store.requeue_orphans("w1", "again") == []


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
    """COPY enqueue inserts all rows with their fields, and skips live dedupe keys, within the batch too."""
    run_at = datetime.now(UTC) + timedelta(hours=1)
    rows = [("k", "q1", '{"n": 1}', 3, 2, None, None), ("k", "q2", '"text"', 0, 25, run_at, "key"),
            ("k", "q2", "null", 0, 25, None, "key")]
    assert store.enqueue_many(rows) == 2
    with connect(pg_dsn) as conn:
        got = conn.execute("SELECT queue, payload, priority, max_attempts, run_at > now(), dedupe_key "
                           "FROM shardworker.jobs ORDER BY id").fetchall()
    assert got == [("q1", {"n": 1}, 3, 2, False, None), ("q2", "text", 0, 25, True, "key")]
    assert store.enqueue_many([("k", "default", "1", 0, 25, None, "key")]) == 0


def test_enqueue_many_is_all_or_nothing_on_a_check_violation(store: PgStore, pg_dsn: str) -> None:
    """A row violating a CHECK (max_attempts 0) among good rows fails the batch and inserts nothing."""
    rows = [("k", "default", "null", 0, 25, None, None)] * 50
    rows[25] = ("k", "default", "null", 0, 0, None, None)
    with pytest.raises(ShardworkerError, match="max_attempts"):
        store.enqueue_many(rows)
    assert count_jobs(pg_dsn) == 0
    assert store.enqueue_many(rows[:3]) == 3  # the connection is still usable


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
    store = PgStore(StoreConfig(private_pg.dsn, connect_timeout_s=2, statement_timeout_s=5))
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


def test_only_one_rescuer_holds_the_lock(store: PgStore, other: PgStore, pg_dsn: str) -> None:
    """A second rescuer on another connection rescues nothing while the first holds the lock."""
    job_id = add_id(store)
    store.claim(["k"], None, "w-dead", 10)
    beat(store, "w-dead")
    first, second = Rescuer(store, "w-1", 10.0), Rescuer(other, "w-2", 10.0)
    assert first.run_once(0.0) == []
    assert second.run_once(0.0) == []
    assert second.run_once(50.0) == []
    assert row(pg_dsn, job_id)["status"] == "running"
    assert first.run_once(10.0) == [job_id]


def test_rescuer_rescues_nobody_right_after_its_store_reconnected(private_pg: EmbeddedPostgres) -> None:
    """When the rescuer's store lost its session (server restart), earlier observations prove nothing."""
    store = PgStore(StoreConfig(private_pg.dsn, connect_timeout_s=2))
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
