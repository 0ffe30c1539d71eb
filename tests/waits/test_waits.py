"""Durable waits through real workers (``tests/apps/waits_app.py``): a sleep that is never slept
again, events sent from another process's transaction (or rolled back), before the wait, from a
handler, to nobody; a timeout; progress on the row and to ``wait_for``; ``jobs wake``; a
cancelled waiter. Runs are counted inside the handlers; every job's final row is checked."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

import shardworker
from shardworker import jobs
from shardworker.errors import JobsError
from tests.helpers import enqueue, exit_code, query, runs_per_job, start_worker, wait_for
from tests.steps.step_ledger import reruns_after_return, step_runs


def status(dsn: str, job_id: int) -> str:
    return query(dsn, "SELECT status FROM shardworker.jobs WHERE id = %s", job_id)[0][0]


def test_a_sleep_frees_the_worker_and_the_job_goes_on_after_it(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    outbox_dir, count_dir = dirs
    (job_id,) = enqueue(pg_dsn, "nap", 1, {"sleep": 3})
    proc = start_worker(pg_dsn, outbox_dir, count_dir, procs=1, app="waits_app")
    try:
        wait_for(lambda: status(pg_dsn, job_id) == "waiting", 20, "the job to wait")
        slept_at = time.time()
        info = jobs.get_job(pg_dsn, job_id)
        assert info is not None and info.wait == "sleep" and info.waiting_on.startswith("sleep until ")
        fast = enqueue(pg_dsn, "fast", 5)
        wait_for(lambda: all(status(pg_dsn, i) == "done" for i in fast), 20, "fast jobs beside the sleeper")
        assert status(pg_dsn, job_id) == "waiting"  # the only child ran them: the sleeper held nothing
        wait_for(lambda: status(pg_dsn, job_id) == "done", 20, "the sleeper to finish")
        assert time.time() - slept_at >= 2.0
    finally:
        proc.terminate()
        exit_code(proc, 30, count_dir)
    assert runs_per_job(count_dir)[job_id] == 2  # up to the sleep, then after it
    assert step_runs(count_dir)[(job_id, "before")] == 1 and step_runs(count_dir)[(job_id, "after")] == 1
    assert not reruns_after_return(count_dir)
    row = query(pg_dsn, "SELECT status, result, attempt, snoozes, wait_kind FROM shardworker.jobs WHERE id = %s",
                job_id)[0]
    assert row == ("done", {"before": f"before-{job_id}", "after": f"after-{job_id}"}, 2, 1, None)


def test_an_event_from_another_transaction_wakes_its_waiter_and_a_rollback_does_not(
        pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    outbox_dir, count_dir = dirs
    (job_id,) = enqueue(pg_dsn, "approval", 1, {"order": 7})
    proc = start_worker(pg_dsn, outbox_dir, count_dir, procs=1, app="waits_app")
    try:
        wait_for(lambda: status(pg_dsn, job_id) == "waiting", 20, "the job to wait for its approval")
        info = jobs.get_job(pg_dsn, job_id)
        assert info is not None and info.wait == "event" and info.wait_key == "approve:7"
        with psycopg.connect(pg_dsn) as conn, conn.transaction():
            assert shardworker.send_event(conn, "approve:7", {"by": "nobody"}) == 1
            raise psycopg.Rollback()
        time.sleep(1.5)
        assert status(pg_dsn, job_id) == "waiting"  # the rolled-back event never was
        with psycopg.connect(pg_dsn) as conn, conn.transaction():
            conn.execute("CREATE TABLE IF NOT EXISTS approvals (id int)")
            conn.execute("INSERT INTO approvals VALUES (7)")
            assert shardworker.send_event(conn, "approve:7", {"by": "ana"}) == 1
        wait_for(lambda: status(pg_dsn, job_id) == "done", 20, "the approved job to finish")
    finally:
        proc.terminate()
        exit_code(proc, 30, count_dir)
    assert query(pg_dsn, "SELECT result FROM shardworker.jobs WHERE id = %s", job_id)[0][0] == {
        "decision": {"by": "ana"}}
    assert runs_per_job(count_dir)[job_id] == 2
    assert step_runs(count_dir)[(job_id, "draft")] == 1 and step_runs(count_dir)[(job_id, "ship")] == 1
