"""PgStore on a real PostgreSQL: schema, claiming, fenced outcomes, release and orphans.
Every test gets a fresh migrated database (``pg_dsn``)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from shardworker.errors import SchemaMissing
from shardworker.model import ApplyResult, ClaimedJob, Outcome
from shardworker.store.pg_store import PgStore, StoreConfig
from shardworker.store.schema import available_migrations, latest_version
from tests.store.support import add_id, claim_one, connect, done, failure, row

# --- schema -------------------------------------------------------------------------------


def test_migrate_applies_every_file_once_then_nothing(empty_dsn: str) -> None:
    """The first migrate applies every migration in order; the second applies none and changes nothing."""
    store = PgStore(StoreConfig(dsn=empty_dsn))
    try:
        expected = [m.name for m in available_migrations()]
        assert expected[:2] == ["0001_create_jobs.sql", "0002_create_workers.sql"]
        assert store.migrate(available_migrations()) == expected
        assert store.migrate(available_migrations()) == []
        store.check_schema()
    finally:
        store.close()
    with connect(empty_dsn) as conn:
        ledger = conn.execute("SELECT version, name FROM shardworker.migrations ORDER BY version").fetchall()
    assert [name for _, name in ledger] == expected


def test_migrate_on_migrated_database_applies_nothing(store: PgStore, pg_dsn: str) -> None:
    """Migrating an up-to-date database is a no-op that keeps existing jobs."""
    job_id = add_id(store)
    assert store.migrate(available_migrations()) == []
    assert row(pg_dsn, job_id)["status"] == "queued"


def test_check_schema_raises_schema_missing_on_empty_database(empty_dsn: str) -> None:
    """check_schema (and any query) raises SchemaMissing when the schema was never created."""
    store = PgStore(StoreConfig(dsn=empty_dsn))
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
    latest = latest_version()
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
    seed = PgStore(StoreConfig(dsn=pg_dsn))
    rows = [("k", "default", "null", 0, 25, None, None)] * 400
    assert seed.enqueue_many(rows) == 400
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


def test_apply_final_failure_fails_at_once(store: PgStore, pg_dsn: str) -> None:
    """A ``FAILED`` outcome (for good) marks the job failed even with attempts left."""
    add_id(store, max_attempts=10)
    job = claim_one(store)
    store.apply_outcomes([Outcome.failed(job.id, job.attempt, "permanent")])
    r = row(pg_dsn, job.id)
    assert (r["status"], r["attempt"], r["last_error"]) == ("failed", 1, "permanent")
    assert r["finished_at"] is not None


def test_apply_outcome_of_an_older_attempt_is_stale(store: PgStore, other: PgStore, pg_dsn: str) -> None:
    """After a job is rescued and re-claimed, the old attempt's outcome is stale and overwrites nothing."""
    add_id(store)
    old = claim_one(store, "w-old")
    assert rescue(store, "w-old") == [old.id]
    new = claim_one(other, "w-new")
    assert new.attempt == old.attempt + 1
    result = store.apply_outcomes([done(old, '{"from": "old"}')])
    assert result == ApplyResult(applied=0, replayed=0, stale=1, stale_ids=(old.id,))
    r = row(pg_dsn, old.id)
    assert (r["status"], r["attempt"], r["locked_by"], r["result"]) == ("running", 2, "w-new", None)
    assert other.apply_outcomes([done(new, '{"from": "new"}')]) == ApplyResult(applied=1)
    assert row(pg_dsn, old.id)["result"] == {"from": "new"}


def test_a_late_outcome_of_a_rescued_attempt_applies_before_the_job_is_claimed_again(
        store: PgStore, pg_dsn: str) -> None:
    """A rescued job waits out the grace period; its rescued attempt's outcome, arriving late from
    the silent host, is applied meanwhile instead of the job running again."""
    add_id(store)
    job = claim_one(store, "w-old")
    assert rescue(store, "w-old", grace_s=600) == [job.id]
    r = row(pg_dsn, job.id)
    assert (r["status"], r["rescued_attempt"], r["due_in_s"] > 590) == ("queued", 1, True)
    assert store.claim(["k"], None, "w-new", 10) == []  # not before the grace period
    assert store.apply_outcomes([done(job, '{"late": true}')]) == ApplyResult(applied=1)
    r = row(pg_dsn, job.id)
    assert (r["status"], r["attempt"], r["result"], r["rescued_attempt"]) == ("done", 1, {"late": True}, None)


def test_rescue_spares_a_worker_whose_heartbeat_changed_since_it_was_watched(store: PgStore, pg_dsn: str) -> None:
    """rescue_workers acts on the heartbeat the rescuer observed; a worker that beat since keeps its jobs."""
    add_id(store)
    job = claim_one(store, "w-slow")
    store.heartbeat("w-slow", "host", 1)
    observed = store.heartbeats()["w-slow"]
    store.heartbeat("w-slow", "host", 1)  # it beat again after the observation
    assert store.rescue_workers([("w-slow", observed)]) == []
    assert row(pg_dsn, job.id)["status"] == "running"


def rescue(store: PgStore, worker: str, grace_s: float = 0.0) -> list[int]:
    """Rescue ``worker`` as a rescuer that watched its (fresh) heartbeat would."""
    store.heartbeat(worker, "host", 1)
    return store.rescue_workers([(worker, store.heartbeats()[worker])], grace_s)


def test_applying_an_outcome_twice_is_a_replay(store: PgStore, pg_dsn: str) -> None:
    """A second apply of the same attempt's outcome, even with another result, changes nothing."""
    add_id(store)
    job = claim_one(store)
    assert store.apply_outcomes([done(job, '{"v": 1}')]) == ApplyResult(applied=1)
    before = row(pg_dsn, job.id)
    assert store.apply_outcomes([done(job, '{"v": 1}')]) == ApplyResult(replayed=1)
    final = Outcome.failed(job.id, job.attempt, "boom")
    assert store.apply_outcomes([done(job, '{"v": 2}'), final]) == ApplyResult(replayed=2)
    after = row(pg_dsn, job.id)
    assert {k: v for k, v in after.items() if k != "due_in_s"} == {k: v for k, v in before.items()
                                                                   if k != "due_in_s"}


def test_apply_batch_classifies_applied_replayed_and_missing(store: PgStore, pg_dsn: str) -> None:
    """One batch applies the live outcome, counts the replay and reports the unknown job as missing."""
    add_id(store)
    add_id(store)
    finished, live = store.claim(["k"], None, "w1", 2)
    store.apply_outcomes([done(finished)])
    missing = Outcome.done(10**12, 1, b"1")
    result = store.apply_outcomes([done(live, "7"), done(finished), missing])
    assert result == ApplyResult(applied=1, replayed=1, missing_ids=(10**12,))
    assert row(pg_dsn, live.id)["result"] == 7


def test_apply_batch_accepts_integer_and_float_delays(store: PgStore, pg_dsn: str) -> None:
    """A batch whose delays mix -1 (int) and 0.5 (float) applies both outcomes."""
    add_id(store)
    add_id(store)
    a, b = store.claim(["k"], None, "w1", 2)
    assert store.apply_outcomes([Outcome.failed(a.id, a.attempt, "boom"), failure(b, 0.5)]) == ApplyResult(applied=2)
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
