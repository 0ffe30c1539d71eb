"""Dedupe that users can shape, on a real PostgreSQL: ``dedupe_window`` (a job with the key
enqueued or ended within the window is a duplicate, done and failed ones too), ``debounce``
(one still queued takes the new payload and is pushed back, so many edits make one run),
and ``jobs update`` of a queued job's time, priority or queue; through Python (sync, async,
one and many) and the console script."""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from shardworker import JobSpec, enqueue, enqueue_async, enqueue_many
from shardworker import jobs as jobs_api
from shardworker.errors import EnqueueError, JobsError
from tests.cli.test_day_two_cli import sw
from tests.helpers import execute, query


def end(dsn: str, job_id: int, status: str = "done", ago_s: float = 0.0) -> None:
    execute(dsn, "UPDATE shardworker.jobs SET status = %s, finished_at = now() - make_interval(secs => %s), "
                 "created_at = now() - make_interval(secs => %s) WHERE id = %s", status, ago_s, ago_s, job_id)


@pytest.mark.parametrize("status", ["done", "failed", "cancelled"])
def test_a_job_that_ended_within_the_window_makes_the_next_a_duplicate(pg_dsn: str, status: str) -> None:
    first = enqueue(pg_dsn, "report", dedupe_key="daily", dedupe_window=3600)
    assert first is not None
    assert enqueue(pg_dsn, "report", dedupe_key="daily", dedupe_window=3600) is None  # live
    end(pg_dsn, first, status, ago_s=600)
    assert enqueue(pg_dsn, "report", dedupe_key="daily", dedupe_window=3600) is None  # ended 10 minutes ago
    assert enqueue(pg_dsn, "report", dedupe_key="daily", dedupe_window=300) is not None  # past a 5-minute window


def test_without_a_window_a_finished_job_holds_its_key_no_more(pg_dsn: str) -> None:
    first = enqueue(pg_dsn, "report", dedupe_key="daily")
    assert first is not None
    end(pg_dsn, first)
    assert enqueue(pg_dsn, "report", dedupe_key="daily") is not None


def test_concurrent_enqueues_in_a_window_make_one_job(pg_dsn: str) -> None:
    ids: list[int | None] = []
    barrier = threading.Barrier(8)

    def one() -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            barrier.wait()
            ids.append(enqueue(conn, "report", dedupe_key="hourly", dedupe_window=3600))

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len([i for i in ids if i is not None]) == 1
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs") == [(1,)]


def test_debounce_makes_many_edits_one_run_after_the_last(pg_dsn: str) -> None:
    first = enqueue(pg_dsn, "reindex", {"edit": 0}, dedupe_key="doc-1", debounce=60)
    assert first is not None
    (was,) = query(pg_dsn, "SELECT run_at FROM shardworker.jobs WHERE id = %s", first)[0]
    for n in range(1, 100):
        assert enqueue(pg_dsn, "reindex", {"edit": n}, dedupe_key="doc-1", debounce=60) == first
    rows = query(pg_dsn, "SELECT id, payload, run_at FROM shardworker.jobs")
    assert len(rows) == 1 and rows[0][1] == {"edit": 99} and rows[0][2] > was
    assert rows[0][2] - datetime.now(UTC) > timedelta(seconds=50)


def test_a_debounced_job_that_started_is_not_replaced(pg_dsn: str) -> None:
    first = enqueue(pg_dsn, "reindex", {"edit": 0}, dedupe_key="doc-1", debounce=60)
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'running', attempt = 1 WHERE id = %s", first)
    assert enqueue(pg_dsn, "reindex", {"edit": 1}, dedupe_key="doc-1", debounce=60) is None
    assert query(pg_dsn, "SELECT payload FROM shardworker.jobs") == [({"edit": 0},)]
    end(pg_dsn, first)  # type: ignore[arg-type]
    assert enqueue(pg_dsn, "reindex", {"edit": 2}, dedupe_key="doc-1", debounce=60) not in (None, first)


def test_many_and_async_take_windows_and_debounce(pg_dsn: str) -> None:
    ids = enqueue_many(pg_dsn, [JobSpec("r", {"n": 1}, dedupe_key="a", debounce=30),
                                JobSpec("r", {"n": 2}, dedupe_key="a", debounce=30),
                                JobSpec("r", dedupe_key="b", dedupe_window=60), JobSpec("r", dedupe_key="b",
                                                                                        dedupe_window=60),
                                JobSpec("r")])
    assert ids[0] == ids[1] and ids[2] is not None and ids[3] is None and ids[4] is not None

    async def later() -> int | None:
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as aconn:
            return await enqueue_async(aconn, "r", {"n": 3}, dedupe_key="a", debounce=30)

    assert asyncio.run(later()) == ids[0]
    assert query(pg_dsn, "SELECT payload FROM shardworker.jobs WHERE id = %s", ids[0]) == [({"n": 3},)]


@pytest.mark.parametrize("call, message", [
    (lambda dsn: enqueue(dsn, "r", dedupe_window=60), "dedupe_window needs a dedupe_key"),
    (lambda dsn: enqueue(dsn, "r", debounce=60), "debounce needs a dedupe_key"),
    (lambda dsn: enqueue(dsn, "r", dedupe_key="k", debounce=1, dedupe_window=1), "not both"),
    (lambda dsn: enqueue(dsn, "r", dedupe_key="k", debounce=-1), "debounce must be a number of seconds"),
    (lambda dsn: enqueue(dsn, "r", dedupe_key="k", dedupe_window=60, after=[1]), "does not go with after="),
])
def test_bad_windows_are_refused_before_anything_is_sent(pg_dsn: str, call: object, message: str) -> None:
    with pytest.raises(EnqueueError, match=message):
        call(pg_dsn)  # type: ignore[operator]
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs") == [(0,)]


def test_update_changes_a_queued_job_and_refuses_any_other(pg_dsn: str) -> None:
    queued = enqueue(pg_dsn, "r", delay_s=3600)
    assert queued is not None
    job = jobs_api.update(pg_dsn, queued, priority=-3, queue="urgent", delay_s=0)
    assert (job.priority, job.queue) == (-3, "urgent") and job.run_at <= datetime.now(UTC)
    at = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert jobs_api.update(pg_dsn, queued, run_at=at).run_at == at
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'running' WHERE id = %s", queued)
    with pytest.raises(JobsError, match=f"cannot update job {queued}: it is running"):
        jobs_api.update(pg_dsn, queued, priority=1)
    with pytest.raises(JobsError, match="no job 999"):
        jobs_api.update(pg_dsn, 999, priority=1)
    with pytest.raises(JobsError, match="give a run_at, a delay"):
        jobs_api.update(pg_dsn, queued)


def test_the_cli_debounces_windows_and_updates(pg_dsn: str) -> None:
    line = sw(pg_dsn, "enqueue", "reindex", '{"v": 1}', "--dedupe-key", "doc", "--debounce", "1m").stdout
    [(job_id,)] = query(pg_dsn, "SELECT id FROM shardworker.jobs")
    assert line.startswith(f"debounced: job {job_id} runs 60s after the last enqueue with its key")
    assert str(job_id) in sw(pg_dsn, "enqueue", "reindex", '{"v": 2}', "--dedupe-key", "doc", "--debounce", "1m").stdout
    sw(pg_dsn, "enqueue", "report", "--dedupe-key", "daily", "--dedupe-window", "1h")
    end(pg_dsn, query(pg_dsn, "SELECT id FROM shardworker.jobs WHERE kind = 'report'")[0][0])
    skipped = sw(pg_dsn, "enqueue", "report", "--dedupe-key", "daily", "--dedupe-window", "1h").stdout
    assert "a job with dedupe key 'daily' is live, or was enqueued or ended within the last 3600s" in skipped
    updated = sw(pg_dsn, "jobs", "update", str(job_id), "--priority", "5", "--queue", "slow").stdout
    assert updated.startswith(f"job {job_id} updated: run_at ") and updated.endswith("priority 5, queue slow\n")
    shown = json.loads(sw(pg_dsn, "jobs", "update", str(job_id), "--run-at", "2031-01-02T03:04:05", "--json").stdout)
    assert shown["run_at"] == "2031-01-02T03:04:05+00:00"
    refused = sw(pg_dsn, "jobs", "update", str(job_id), code=1)
    assert refused.stderr.count("\n") == 1 and "give a run_at, a delay, a priority or a queue" in refused.stderr


@pytest.mark.parametrize("past", ["retried", "rescued", "snoozed"])
def test_a_debounced_job_that_ran_before_is_not_replaced(pg_dsn: str, past: str) -> None:
    """A queued holder that already ran (a retry waiting its backoff, a job a peer rescued and
    that waits its grace, a snooze) has recorded steps or a late outcome coming for the
    payload it ran with: the enqueue leaves it alone (found by a review)."""
    first = enqueue(pg_dsn, "charge", {"amount": 100}, dedupe_key="order-1", debounce=60)
    extra = {"rescued": ", rescued_attempt = 1", "snoozed": ", snoozes = 1"}.get(past, "")
    execute(pg_dsn, f"UPDATE shardworker.jobs SET attempt = 1{extra} WHERE id = %s", first)
    assert enqueue(pg_dsn, "charge", {"amount": 250}, dedupe_key="order-1", debounce=60) is None
    assert query(pg_dsn, "SELECT payload FROM shardworker.jobs") == [({"amount": 100},)]


def test_update_keeps_a_rescued_jobs_grace(pg_dsn: str) -> None:
    """A rescued job waits --rescue-grace so its dead worker's late outcome can land first:
    its time cannot be moved earlier (found by a review); its priority can change."""
    job_id = enqueue(pg_dsn, "r", delay_s=300)
    execute(pg_dsn, "UPDATE shardworker.jobs SET attempt = 1, rescued_attempt = 1 WHERE id = %s", job_id)
    with pytest.raises(JobsError, match="rescued: it waits its grace"):
        jobs_api.update(pg_dsn, job_id, delay_s=0)  # type: ignore[arg-type]
    assert jobs_api.update(pg_dsn, job_id, priority=-1).priority == -1  # type: ignore[arg-type]


def test_debounce_never_brings_a_job_earlier_than_an_operator_set_it(pg_dsn: str) -> None:
    """jobs update --delay 10m, then one more debounced enqueue: the job stays ten minutes out
    (found by a new user's trial: it came back to now + debounce)."""
    job_id = enqueue(pg_dsn, "reindex", {"v": 1}, dedupe_key="doc", debounce=30)
    later = jobs_api.update(pg_dsn, job_id, delay_s=600).run_at  # type: ignore[arg-type]
    assert enqueue(pg_dsn, "reindex", {"v": 2}, dedupe_key="doc", debounce=30) == job_id
    assert query(pg_dsn, "SELECT run_at, payload FROM shardworker.jobs") == [(later, {"v": 2})]
