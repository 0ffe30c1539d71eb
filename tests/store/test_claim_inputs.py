"""What a claim brings with a job besides its payload: the steps its earlier attempts recorded
and the results of the jobs it waited on (issue 41, 1). Their sizes are counted as the JSON
text the handler receives, not as PostgreSQL stores them (compressed), both in the claim's
byte budget and in the input a run may be given; over that budget the claim brings neither
and says how big they were (the child fails the job for good with that,
tests/worker/test_large_inputs.py), and the claim goes on for the other jobs."""

from __future__ import annotations

import time

import orjson
import pytest

from shardworker.client import enqueue
from shardworker.core.model import ClaimedJob, Outcome, StepRecord
from shardworker.store.pg_store import PgStore
from tests.helpers import query
from tests.store.support import add_id

MB = 1_000_000

# The plain claim (no limits in the way) and the full one (a cap of this worker's forces it).
PATHS = {"plain": None, "full": {"k": 100, "merge": 100}}


def _claim(store: PgStore, kinds: list[str], path: str, limit: int = 10, **options: object) -> list[ClaimedJob]:
    return store.claim_within(kinds, None, "w1", limit, caps=PATHS[path], **options).jobs  # type: ignore[arg-type]


def _retried_with_steps(store: PgStore, *steps: dict[str, object]) -> list[int]:
    """Jobs whose first attempt recorded ``steps`` (one dict for each) and then failed (due
    again at once)."""
    ids = [add_id(store) for _ in steps]
    jobs = store.claim_within(["k"], None, "w0", len(ids)).jobs
    assert [job.id for job in jobs] == ids
    records = [StepRecord(job.id, job.attempt, name, orjson.dumps(value), time.time())
               for job, recorded in zip(jobs, steps, strict=True) for name, value in recorded.items()]
    store.apply_outcomes([Outcome.retry(job.id, job.attempt, "boom", 0.0) for job in jobs], records)
    return ids


def _done_with(store: PgStore, kind: str, result: object) -> int:
    (job,) = store.claim_within([kind], None, "w0", 1).jobs
    store.apply_outcomes([Outcome.done(job.id, job.attempt, orjson.dumps(result))])
    return job.id


@pytest.mark.parametrize("path", list(PATHS))
def test_recorded_steps_reach_the_retry_as_they_were_recorded(store: PgStore, path: str) -> None:
    steps = {"fetch": {"text": "ünïcode ☃", "n": [1, 2.5, None, True]}, "b": None, "a": "x" * 3000, "": 0,
             'quote"name': [{"nested": {"deep": []}}]}
    (job_id,) = _retried_with_steps(store, steps)
    (job,) = _claim(store, ["k"], path)
    assert (job.id, job.attempt, job.withheld) == (job_id, 2, None)
    assert job.steps_json is not None and orjson.loads(job.steps_json) == steps


@pytest.mark.parametrize("path", list(PATHS))
def test_steps_over_the_input_budget_are_withheld_and_the_claim_goes_on(store: PgStore, path: str) -> None:
    big, small = _retried_with_steps(store, {f"part{i}": "x" * (2 * MB) for i in range(3)}, {"one": "y" * 1000})
    jobs = {job.id: job for job in _claim(store, ["k"], path, max_input_bytes=5 * MB)}
    assert set(jobs) == {big, small}
    assert jobs[big].steps_json is None and jobs[big].withheld is not None
    steps_bytes, deps_bytes = jobs[big].withheld
    assert 6 * MB <= steps_bytes < 6 * MB + 1000 and deps_bytes == 0
    assert jobs[small].withheld is None and orjson.loads(jobs[small].steps_json or "") == {"one": "y" * 1000}


@pytest.mark.parametrize("path", list(PATHS))
def test_the_claim_byte_budget_counts_a_retried_jobs_steps_as_text(store: PgStore, path: str) -> None:
    """Steps of 6 MB of one repeated letter take a few kB in PostgreSQL; the claim's byte
    budget counts the 6 MB the worker will hold."""
    first, _ = _retried_with_steps(store, {"part": "x" * (6 * MB)}, {"part": "x" * (6 * MB)})
    jobs = _claim(store, ["k"], path, max_bytes=8 * MB)
    assert [job.id for job in jobs] == [first]  # the second would bring the claim to 12 MB


@pytest.mark.parametrize("path", list(PATHS))
def test_dependency_results_count_as_text_and_are_withheld_over_the_budget(store: PgStore, pg_dsn: str,
                                                                         path: str) -> None:
    a, b = enqueue(pg_dsn, "a"), enqueue(pg_dsn, "b")
    assert a and b
    merge = enqueue(pg_dsn, "merge", after=[a, b])
    _done_with(store, "a", "x" * (3 * MB))
    _done_with(store, "b", {"text": "y" * (3 * MB)})
    ((deps_bytes,),) = query(pg_dsn, "SELECT deps_bytes FROM shardworker.jobs WHERE id = %s", merge)
    assert 6 * MB <= deps_bytes < 6 * MB + 100  # not the few kB PostgreSQL stores
    (job,) = _claim(store, ["merge"], path, max_input_bytes=5 * MB)
    assert (job.id, job.dependencies_json, job.withheld) == (merge, None, (0, deps_bytes))


@pytest.mark.parametrize("path", list(PATHS))
def test_dependency_results_within_the_budget_reach_the_merge(store: PgStore, pg_dsn: str, path: str) -> None:
    a, b = enqueue(pg_dsn, "a"), enqueue(pg_dsn, "b")
    assert a and b
    merge = enqueue(pg_dsn, "merge", after=[b, a])
    _done_with(store, "a", None)
    _done_with(store, "b", {"text": "B ☃"})
    (job,) = _claim(store, ["merge"], path)
    assert job.id == merge and job.withheld is None
    assert job.to_job().dependencies == {a: None, b: {"text": "B ☃"}}
