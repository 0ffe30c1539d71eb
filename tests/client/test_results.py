"""Reading results: ``get_job`` and ``wait_for`` on a real PostgreSQL. ``wait_for`` wakes on
the notification the apply statement sends, not by polling: a change made behind its back
(plain SQL, no notification) does not wake it."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import shardworker
from shardworker import jobs
from shardworker.core.model import Outcome
from shardworker.errors import JobsError, WaitTimeout
from shardworker.store.pg_store import PgStore, StoreConfig
from tests.helpers import enqueue, execute, exit_code, query, start_worker, worker_env


def in_thread(fn: Any, *args: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        try:
            box["value"] = fn(*args)
        except BaseException as exc:
            box["error"] = exc
        box["took"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def finish(dsn: str, job_id: int, result: bytes = b'{"n": 1}') -> None:
    """Claim the job and apply its outcome with the worker's own statements."""
    store = PgStore(StoreConfig(dsn=dsn))
    try:
        claimed = store.claim(["k"], None, "w1", 1)
        job = next(j for j in claimed if j.id == job_id)
        assert store.apply_outcomes([Outcome.done(job.id, job.attempt, result)]).applied == 1
    finally:
        store.close()


def test_wait_for_wakes_on_the_outcome_not_on_a_poll(pg_dsn: str) -> None:
    (job_id,) = enqueue(pg_dsn, "k", 1)
    thread, box = in_thread(shardworker.wait_for, pg_dsn, job_id, 30)
    time.sleep(0.5)
    # Marked done behind its back, with no notification: a poller would return now.
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'running', attempt = 1 WHERE id = %s", job_id)
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'queued', attempt = 0 WHERE id = %s", job_id)
    time.sleep(1.5)
    assert thread.is_alive(), box
    finish(pg_dsn, job_id)
    thread.join(5)
    assert not thread.is_alive()
    info = box["value"]
    assert (info.id, info.status, info.result) == (job_id, "done", {"n": 1})


def test_wait_for_returns_at_once_for_an_ended_job_and_times_out_on_a_queued_one(pg_dsn: str) -> None:
    done_id, queued_id = enqueue(pg_dsn, "k", 2)
    finish(pg_dsn, done_id)
    assert shardworker.wait_for(pg_dsn, done_id, 0).status == "done"
    started = time.monotonic()
    with pytest.raises(WaitTimeout, match=f"job {queued_id} is still queued after 0.5s"):
        shardworker.wait_for(pg_dsn, queued_id, 0.5)
    assert time.monotonic() - started > 0.4  # it waited its timeout (a slow machine only adds to it)
    with pytest.raises(TimeoutError):  # WaitTimeout is a TimeoutError too
        shardworker.wait_for(pg_dsn, queued_id, 0)
    with pytest.raises(JobsError, match="no job 999999"):
        shardworker.wait_for(pg_dsn, 999999, 1)
    with pytest.raises(JobsError, match="timeout_s"):
        shardworker.wait_for(pg_dsn, queued_id, -1)


def test_cancel_and_delete_end_a_wait(pg_dsn: str) -> None:
    a, b = enqueue(pg_dsn, "k", 2)
    # Waits of 10 minutes: only the cancel and the delete can end them within the joins.
    ta, box_a = in_thread(shardworker.wait_for, pg_dsn, a, 600)
    tb, box_b = in_thread(shardworker.wait_for, pg_dsn, b, 600)
    time.sleep(0.5)
    jobs.cancel(pg_dsn, [a])
    jobs.delete(pg_dsn, [b])
    ta.join(120)
    tb.join(120)
    assert box_a["value"].status == "cancelled" and box_a["took"] < 120
    assert isinstance(box_b["error"], JobsError) and f"no job {b}" in str(box_b["error"])


@pytest.mark.parametrize("autocommit", [True, False])
def test_wait_for_on_the_callers_connection_leaves_it_as_it_was(pg_dsn: str, autocommit: bool) -> None:
    (job_id,) = enqueue(pg_dsn, "k", 1)
    with psycopg.connect(pg_dsn, autocommit=autocommit) as conn:
        thread, box = in_thread(shardworker.wait_for, conn, job_id, 600)  # only the finish ends it in time
        time.sleep(0.5)
        finish(pg_dsn, job_id)
        thread.join(120)
        assert box["value"].status == "done" and box["took"] < 120
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert conn.execute("SELECT count(*) FROM pg_listening_channels()").fetchone() == (0,)
        if not autocommit:
            conn.rollback()
        assert shardworker.get_job(conn, job_id).result == {"n": 1}


def test_wait_for_refuses_a_connection_inside_a_transaction(pg_dsn: str) -> None:
    (job_id,) = enqueue(pg_dsn, "k", 1)
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("SELECT 1")
        with pytest.raises(JobsError, match="outside a transaction"):
            shardworker.wait_for(conn, job_id, 1)


def test_many_ends_in_one_batch_wake_each_waiter(pg_dsn: str) -> None:
    """One apply of 1,000 outcomes sends its ids in several notifications (300 a
    notification); every waiter, whichever chunk holds its id, wakes."""
    ids = enqueue(pg_dsn, "k", 1000)
    watched = [ids[0], ids[299], ids[300], ids[650], ids[-1]]
    waits = [in_thread(shardworker.wait_for, pg_dsn, i, 30) for i in watched]
    time.sleep(0.5)
    store = PgStore(StoreConfig(dsn=pg_dsn))
    try:
        claimed = store.claim(["k"], None, "w1", 1000)
        assert store.apply_outcomes([Outcome.done(j.id, j.attempt, b"1") for j in claimed]).applied \
            == 1000
    finally:
        store.close()
    for thread, box in waits:
        thread.join(5)
        assert box["value"].status == "done", box


def test_jobs_wait_command_with_a_running_worker(pg_dsn: str, tmp_path: Path) -> None:
    count_dir = tmp_path / "count"
    count_dir.mkdir()
    (job_id,) = enqueue(pg_dsn, "slow", 1, {"sleep": 1.0})
    waiter = subprocess.run([sys.executable, "-m", "shardworker", "jobs", "wait", str(job_id), "--timeout", "0.2",
                             "--dsn", pg_dsn], capture_output=True, text=True, env=worker_env(count_dir), timeout=60)
    assert waiter.returncode == 1 and "still queued" in waiter.stderr and "Traceback" not in waiter.stderr
    proc = start_worker(pg_dsn, tmp_path / "outbox", count_dir, "--exit-when-idle", procs=1)
    waiter = subprocess.run([sys.executable, "-m", "shardworker", "jobs", "wait", str(job_id), "--timeout", "60",
                             "--json", "--dsn", pg_dsn], capture_output=True, text=True, env=worker_env(count_dir),
                            timeout=90)
    assert waiter.returncode == 0, waiter.stderr
    assert '"status":"done"' in waiter.stdout
    assert exit_code(proc, 60, count_dir) == 0
    assert query(pg_dsn, "SELECT status FROM shardworker.jobs WHERE id = %s", job_id) == [("done",)]
