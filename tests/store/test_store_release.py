"""PgStore on a real PostgreSQL: releasing claimed jobs (only the claiming worker's, attempt by
attempt) and requeueing a restarted worker's orphans.
Every test gets a fresh migrated database (``pg_dsn``)."""

from __future__ import annotations

from shardworker.store.pg_store import PgStore
from tests.store.support import add_id, claim_one, failure, row


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


def test_an_attempt_whose_steps_were_recorded_is_never_given_back(store: PgStore, pg_dsn: str) -> None:
    """Progress files that say nothing started (zeroed on disk) would give back, uncharged, an
    attempt that recorded steps: claimed again at attempt 1, it got no steps and ran them again
    (issue 41, 10). Such an attempt is not given back; requeued as an orphan, the retry gets
    its steps."""
    from shardworker.core.model import StepRecord

    job_id = add_id(store)
    job = claim_one(store)
    store.apply_outcomes([], [StepRecord(job.id, job.attempt, "fetch", b'"page"', 1.0, job.uid)])
    assert store.release_unstarted("w1", started=[]) == 0
    assert store.release([(job.id, job.attempt)], "w1") == 0
    assert row(pg_dsn, job_id)["status"] == "running"
    assert store.requeue_orphans("w1", "worker restarted while the job was running") == [job_id]
    again = claim_one(store)
    assert again.attempt == 2 and again.steps_json is not None and "fetch" in again.steps_json
