"""PgStore on a real PostgreSQL: applying outcomes, fenced by attempt (stale, replayed, missing),
and a rescued attempt's late outcome.
Every test gets a fresh migrated database (``pg_dsn``)."""

from __future__ import annotations

from shardworker.core.model import ApplyResult, Outcome
from shardworker.store.pg_store import PgStore
from tests.store.support import add_id, claim_one, done, failure, row


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
    assert store.rescue_workers([("w-slow", observed)]) == ((), [])
    assert row(pg_dsn, job.id)["status"] == "running"


def rescue(store: PgStore, worker: str, grace_s: float = 0.0) -> list[int]:
    """Rescue ``worker`` as a rescuer that watched its (fresh) heartbeat would."""
    store.heartbeat(worker, "host", 1)
    return store.rescue_workers([(worker, store.heartbeats()[worker])], grace_s).jobs


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
