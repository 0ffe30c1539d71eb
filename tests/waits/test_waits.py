"""Durable waits through real workers (``tests/apps/waits_app.py``): a sleep that is never slept
again, events sent from another process's transaction (or rolled back), before the wait, from a
handler, to nobody; a timeout; progress on the row and to ``wait_for``; ``jobs wake``; a
cancelled waiter. Runs are counted inside the handlers; every job's final row is checked."""

from __future__ import annotations

import subprocess
import sys
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


def test_an_event_sent_before_the_wait_is_taken_and_a_timeout_raises(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """The event for order 1 is sent (from the command line) before the worker starts: its
    wait takes it at once. Order 2's never comes: past its 1 s timeout the handler sees
    EventTimeout. An event to a key nobody waits for is kept."""
    outbox_dir, count_dir = dirs
    early, late = (enqueue(pg_dsn, "approval", 1, {"order": n, "timeout": 1})[-1] for n in (1, 2))
    sent = subprocess.run([sys.executable, "-m", "shardworker", "events", "send", "approve:1", '{"by": "early"}',
                           "--dsn", pg_dsn], capture_output=True, text=True, timeout=60, cwd=count_dir)
    assert sent.returncode == 0 and "0 waiting jobs woken" in sent.stdout, sent.stderr
    shardworker.send_event(pg_dsn, "nobody:waits", [1, 2])
    proc = start_worker(pg_dsn, outbox_dir, count_dir, procs=1, app="waits_app")
    try:
        wait_for(lambda: status(pg_dsn, early) == "done" and status(pg_dsn, late) == "done", 30, "both approvals")
    finally:
        proc.terminate()
        exit_code(proc, 30, count_dir)
    results = dict(query(pg_dsn, "SELECT id, result FROM shardworker.jobs WHERE id = ANY(%s)", [early, late]))
    assert results == {early: {"decision": {"by": "early"}}, late: {"timed_out": True}}
    assert runs_per_job(count_dir)[early] == 2 and runs_per_job(count_dir)[late] == 2
    assert query(pg_dsn, "SELECT payload FROM shardworker.events WHERE key = 'nobody:waits'") == [([1, 2],)]


def test_a_handler_sends_an_event_with_its_outcome_and_it_wakes_every_waiter_once(
        pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """Two jobs wait on one key; a third job's handler sends to it (job.send_event): both wake
    with its payload, and the event is stored once."""
    outbox_dir, count_dir = dirs
    waiters = enqueue(pg_dsn, "approval", 2, {"order": 9})
    proc = start_worker(pg_dsn, outbox_dir, count_dir, procs=2, app="waits_app")
    try:
        wait_for(lambda: all(status(pg_dsn, i) == "waiting" for i in waiters), 20, "both to wait")
        (sender,) = [i for i in enqueue(pg_dsn, "notifier", 1, {"key": "approve:9", "payload": "go"})
                     if i not in waiters]
        wait_for(lambda: all(status(pg_dsn, i) == "done" for i in [*waiters, sender]), 30, "the waiters to finish")
    finally:
        proc.terminate()
        exit_code(proc, 30, count_dir)
    assert [r for (r,) in query(pg_dsn, "SELECT result FROM shardworker.jobs WHERE id = ANY(%s)", waiters)] == [
        {"decision": "go"}] * 2
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.events WHERE key = 'approve:9'") == [(1,)]
    assert all(runs_per_job(count_dir)[i] == 2 for i in waiters) and runs_per_job(count_dir)[sender] == 1


def test_progress_shows_on_the_row_and_reaches_wait_for(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    outbox_dir, count_dir = dirs
    (job_id,) = enqueue(pg_dsn, "reporter", 1, {"steps": 12, "every": 0.1})
    proc = start_worker(pg_dsn, outbox_dir, count_dir, procs=1, app="waits_app")
    seen: list[dict[str, int]] = []
    try:
        ended = shardworker.wait_for(pg_dsn, job_id, 30, on_progress=seen.append)
    finally:
        proc.terminate()
        exit_code(proc, 30, count_dir)
    assert ended.status == "done" and ended.progress == {"done": 12, "of": 12}
    assert seen[-1] == {"done": 12, "of": 12} and len(seen) >= 3  # reported along the way, not only at the end
    assert [s["done"] for s in seen] == sorted(s["done"] for s in seen)
    listed = subprocess.run([sys.executable, "-m", "shardworker", "jobs", "list", "--dsn", pg_dsn],
                            capture_output=True, text=True, timeout=60, cwd=count_dir)
    line = listed.stdout.splitlines()[1]
    assert line.split()[0] == str(job_id) and "progress {" in line and '"done":12' in line  # jsonb orders keys


def test_jobs_wake_and_cancel_act_on_waiting_jobs(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """`jobs list --status waiting` tells a sleeper from an event's waiter from a dependent;
    `jobs wake` ends a sleep now (and refuses an event's waiter, nothing changed); a
    cancelled waiter never runs again, and neither do the jobs waiting on it."""
    outbox_dir, count_dir = dirs
    (sleeper,) = enqueue(pg_dsn, "nap", 1, {"sleep": 3600})
    waiter = enqueue(pg_dsn, "approval", 1, {"order": 5})[-1]
    dependent = shardworker.enqueue(pg_dsn, "fast", after=[waiter])
    proc = start_worker(pg_dsn, outbox_dir, count_dir, procs=1, app="waits_app")
    cli = [sys.executable, "-m", "shardworker", "jobs"]
    try:
        wait_for(lambda: status(pg_dsn, sleeper) == "waiting" and status(pg_dsn, waiter) == "waiting"
                 and jobs.get_job(pg_dsn, waiter).wait == "event", 20, "both to wait")
        listed = subprocess.run([*cli, "list", "--status", "waiting", "--dsn", pg_dsn], capture_output=True,
                                text=True, timeout=60, cwd=count_dir).stdout
        lines = {int(line.split()[0]): line for line in listed.splitlines()[1:]}
        assert "sleep until " in lines[sleeper] and "event 'approve:5'" in lines[waiter]
        assert lines[dependent].rstrip().endswith("jobs")
        refused = subprocess.run([*cli, "wake", str(sleeper), str(waiter), "--dsn", pg_dsn], capture_output=True,
                                 text=True, timeout=60, cwd=count_dir)
        assert refused.returncode == 1 and f"cannot wake job {waiter}: it waits for an event" in refused.stderr
        assert status(pg_dsn, sleeper) == "waiting"  # nothing changed
        woke = subprocess.run([*cli, "wake", str(sleeper), "--dsn", pg_dsn], capture_output=True, text=True,
                              timeout=60, cwd=count_dir)
        assert woke.returncode == 0 and "1 job woken" in woke.stdout
        wait_for(lambda: status(pg_dsn, sleeper) == "done", 20, "the woken sleeper to finish")
        assert jobs.cancel(pg_dsn, [waiter]) == 1
        shardworker.send_event(pg_dsn, "approve:5", "too late")
        time.sleep(1.5)
    finally:
        proc.terminate()
        exit_code(proc, 30, count_dir)
    assert status(pg_dsn, waiter) == "cancelled" and status(pg_dsn, dependent) == "cancelled"
    assert runs_per_job(count_dir)[waiter] == 1 and runs_per_job(count_dir)[dependent] == 0
    assert runs_per_job(count_dir)[sleeper] == 2
    with pytest.raises(JobsError, match="only a sleeping job"):
        jobs.wake(pg_dsn, [waiter])


def test_an_async_handler_awaits_its_sleep(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    outbox_dir, count_dir = dirs
    (job_id,) = enqueue(pg_dsn, "nap-async", 1, {"sleep": 1})
    proc = start_worker(pg_dsn, outbox_dir, count_dir, procs=1, app="waits_app")
    try:
        wait_for(lambda: status(pg_dsn, job_id) == "done", 20, "the async sleeper")
    finally:
        proc.terminate()
        exit_code(proc, 30, count_dir)
    assert query(pg_dsn, "SELECT result FROM shardworker.jobs WHERE id = %s", job_id)[0][0] == {
        "before": f"before-{job_id}", "woke": True}
    assert runs_per_job(count_dir)[job_id] == 2


def test_a_run_that_passes_a_wait_keeps_its_end_in_the_outbox(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """The database recorded the sleep's end; the run that passes it appends it to its outbox
    too, before the steps after it, so a database that comes back older gets it back with them
    (the kept tail: --reapply-window)."""
    import outbox
    from shardworker.core import records
    from shardworker.core.model import Outcome, StepRecord

    outbox_dir, count_dir = dirs
    (job_id,) = enqueue(pg_dsn, "nap", 1, {"sleep": 0.5})
    proc = start_worker(pg_dsn, outbox_dir, count_dir, procs=1, app="waits_app")
    try:
        wait_for(lambda: status(pg_dsn, job_id) == "done", 20, "the sleeper")
    finally:
        proc.terminate()
        exit_code(proc, 30, count_dir)
    kept = [records.decode_record(r) for r in outbox.records_since(str(outbox_dir), 0, 0.0)]
    order = [(type(r).__name__, getattr(r, "name", None), r.attempt) for r in kept
             if isinstance(r, StepRecord | Outcome) and r.job_id == job_id]
    assert order == [("StepRecord", "before", 1), ("Outcome", None, 1), ("StepRecord", "nap", 2),
                     ("StepRecord", "after", 2), ("Outcome", None, 2)]
