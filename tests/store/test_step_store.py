"""Step records landing in shardworker.job_steps, and coming back with a claim, on a real
PostgreSQL: first recorded wins, a rescued attempt's steps still count, steps of missing or
reset jobs are ignored, and they land in the transaction of the batch's outcomes."""

from __future__ import annotations

import time

import pytest

from shardworker.core.model import Outcome, StepRecord
from shardworker.errors import OutcomeRejected
from shardworker.store.pg_store import PgStore
from tests.helpers import execute, query
from tests.store.support import add_id


def step(job_id: int, attempt: int, name: str, result: bytes = b'"r"') -> StepRecord:
    return StepRecord(job_id, attempt, name, result, time.time())


def test_steps_land_with_the_outcomes_and_the_first_recorded_wins(store: PgStore, pg_dsn: str) -> None:
    job_id = add_id(store, "k")
    [job] = store.claim(["k"], None, "w", 1)
    result = store.apply_outcomes([Outcome.retry(job_id, 1, "boom", 0.0)],
                                  [step(job_id, 1, "a", b"[1,2]"), step(job_id, 1, "b")])
    assert (result.applied, result.steps) == (1, 2)
    again = store.apply_outcomes([], [step(job_id, 1, "a", b'"other"'), step(job_id, 1, "c")])
    assert again.steps == 1
    rows = query(pg_dsn, "SELECT name, attempt, result FROM shardworker.job_steps ORDER BY name")
    assert rows == [("a", 1, [1, 2]), ("b", 1, "r"), ("c", 1, "r")]
    [again_job] = store.claim(["k"], None, "w", 1)
    assert again_job.attempt == 2 and again_job.steps_json is not None
    assert job.steps_json is None  # a first attempt reads no steps


def test_a_rescued_attempts_steps_land_and_missing_or_reset_jobs_take_none(store: PgStore, pg_dsn: str) -> None:
    rescued, reset = add_id(store, "k"), add_id(store, "k")
    store.claim(["k"], None, "w", 2)
    # The first attempt of `rescued` lost its lease and the job was claimed again: its steps still count.
    execute(pg_dsn, "UPDATE shardworker.jobs SET attempt = 2 WHERE id = %s", rescued)
    # An operator forgot the steps of `reset` up to its attempt 1 (jobs retry --reset-steps).
    execute(pg_dsn, "UPDATE shardworker.jobs SET steps_reset_attempt = 1 WHERE id = %s", reset)
    result = store.apply_outcomes([], [step(rescued, 1, "a"), step(reset, 1, "a"), step(reset + 100, 1, "a"),
                                       step(reset, 2, "b")])
    assert result.steps == 2
    assert query(pg_dsn, "SELECT job_id, name FROM shardworker.job_steps ORDER BY job_id") == [(rescued, "a"),
                                                                                                (reset, "b")]


def test_a_refused_outcome_takes_its_batchs_steps_back_with_it(store: PgStore, pg_dsn: str) -> None:
    """Steps and outcomes are one transaction: when the outcomes' statement fails, no step landed."""
    job_id = add_id(store, "k")
    store.claim(["k"], None, "w", 1)
    with pytest.raises(OutcomeRejected, match="json"):
        store.apply_outcomes([Outcome.done(job_id, 1, b"not json")], [step(job_id, 1, "a")])
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.job_steps")[0][0] == 0
    assert store.apply_outcomes([Outcome.done(job_id, 1, b"1")], [step(job_id, 1, "a")]).steps == 1
