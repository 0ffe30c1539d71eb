"""`shardworker jobs cancel` on a running job, through a real worker and the console script:
an async handler's task is cancelled, a threaded one sees job.cancelled, a sync one that
ignores it is stopped after --cancel-grace; the job ends cancelled, nothing runs twice, and
the attempt's late outcome never overwrites the cancel, even after waiting out an outage
in the outbox. Each handler appends its runs to a ledger it fsyncs (tests/apps/cancel_app.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from shardworker import jobs
from shardworker.embedded import EmbeddedPostgres
from tests.helpers import enqueue, exit_code, query, runs, start_worker, wait_for, worker_env, worker_log

FAST = ("--backoff-cap", "0.2")


def stopped(count_dir: Path) -> list[str]:
    """The "job_id how" lines the handlers wrote when they noticed their cancel."""
    return [line for path in count_dir.glob("stopped-*.log") for line in path.read_text().splitlines() if line]


def row(dsn: str, job_id: int) -> tuple[Any, ...]:
    return query(dsn, "SELECT status, result, attempt FROM shardworker.jobs WHERE id = %s", job_id)[0]


def cancel_cli(dsn: str, job_id: int, count_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardworker", "jobs", "cancel", str(job_id), "--dsn", dsn],
                          env=worker_env(count_dir), capture_output=True, text=True, timeout=60)


def started(count_dir: Path, job_id: int) -> bool:
    return any(j == job_id for j, _ in runs(count_dir))


def running(dsn: str, tmp_path: Path, kind: str, *args: str) -> tuple[int, subprocess.Popen[bytes], Path]:
    """A worker (``--procs 1``, ``args``) running one ``kind`` job that would take a minute:
    (the job's id, the worker, its ledger directory)."""
    counts = tmp_path / "counts"
    counts.mkdir()
    [job_id] = enqueue(dsn, kind, 1, {"sleep": 60})
    proc = start_worker(dsn, tmp_path / "outbox", counts, *FAST, *args, procs=1, app="cancel_app")
    wait_for(lambda: started(counts, job_id), 30, "the handler running")
    return job_id, proc, counts


def test_an_async_handler_cancelled_while_running_is_cancelled_and_the_worker_goes_on(
        pg_dsn: str, tmp_path: Path) -> None:
    long, proc, counts = running(pg_dsn, tmp_path, "async_long")
    done = cancel_cli(pg_dsn, long, counts)
    assert done.returncode == 0, done.stderr
    assert row(pg_dsn, long)[0] == "cancelled"  # at once, whatever the worker does next
    assert query(pg_dsn, "SELECT last_error FROM shardworker.jobs WHERE id = %s", long) == [
        ("cancelled by an operator",)]
    wait_for(lambda: f"{long} async" in stopped(counts), 15, "the handler's task cancelled")
    quick = enqueue(pg_dsn, "quick", 5, {"n": 1})
    wait_for(lambda: all(row(pg_dsn, i)[0] == "done" for i in quick), 30, "the worker going on")
    proc.send_signal(signal.SIGTERM)
    assert exit_code(proc, 60, counts) == 0, worker_log(counts)
    assert row(pg_dsn, long) == ("cancelled", None, 1)
    assert runs(counts)[(long, 1)] == 1 and sum(runs(counts).values()) == 6
    assert "stale outcomes" not in worker_log(counts)


def test_a_threaded_handler_sees_job_cancelled_and_its_result_is_not_applied(pg_dsn: str, tmp_path: Path) -> None:
    """Cancelled through the Python API; the handler returns a result once it sees
    job.cancelled, and that result is kept aside, never applied over the cancel."""
    polite, proc, counts = running(pg_dsn, tmp_path, "polite")
    assert jobs.cancel(pg_dsn, [polite]) == 1
    wait_for(lambda: f"{polite} polled" in stopped(counts), 15, "the handler seeing job.cancelled")
    proc.send_signal(signal.SIGTERM)
    assert exit_code(proc, 60, counts) == 0, worker_log(counts)
    assert row(pg_dsn, polite) == ("cancelled", None, 1)
    assert runs(counts)[(polite, 1)] == 1
    kept = (tmp_path / "outbox" / "stale.jsonl").read_text()
    assert f'"job_id":{polite}' in kept and "cancelled while it ran" in kept


def test_a_sync_handler_that_ignores_the_cancel_is_stopped_after_the_grace(pg_dsn: str, tmp_path: Path) -> None:
    """Its child is stopped as a timeout stops it; the job is not run again, and the jobs
    behind it in the same child run once the child is back."""
    stubborn, proc, counts = running(pg_dsn, tmp_path, "stubborn", "--cancel-grace", "1")
    behind = enqueue(pg_dsn, "quick", 3, {"n": 2})
    assert cancel_cli(pg_dsn, stubborn, counts).returncode == 0
    wait_for(lambda: "did not stop within 1s" in worker_log(counts), 30, "the child stopped after the grace")
    wait_for(lambda: all(row(pg_dsn, i)[0] == "done" for i in behind), 30, "the jobs behind it")
    proc.send_signal(signal.SIGTERM)
    assert exit_code(proc, 60, counts) == 0, worker_log(counts)
    assert row(pg_dsn, stubborn) == ("cancelled", None, 1)
    assert runs(counts)[(stubborn, 1)] == 1 and (stubborn, 2) not in runs(counts)


def test_a_stop_does_not_wait_out_the_shutdown_timeout_for_a_cancelled_handler(pg_dsn: str, tmp_path: Path) -> None:
    """SIGTERM right after the cancel: the child is stopped at the grace, not at --shutdown-timeout."""
    stubborn, proc, counts = running(pg_dsn, tmp_path, "stubborn", "--cancel-grace", "1")
    assert cancel_cli(pg_dsn, stubborn, counts).returncode == 0
    wait_for(lambda: "cancelled by an operator; stopping it" in worker_log(counts), 15, "the worker told of the cancel")
    proc.send_signal(signal.SIGTERM)
    assert exit_code(proc, 15, counts) == 0, worker_log(counts)
    assert row(pg_dsn, stubborn) == ("cancelled", None, 1)


def test_a_late_outcome_that_waited_out_an_outage_never_overwrites_the_cancel(
        private_pg: EmbeddedPostgres, tmp_path: Path) -> None:
    """Cancelled while it runs; the database goes away; the handler (which ignores the cancel,
    within a long grace) finishes and its outcome waits in the outbox; the database returns,
    the outbox drains, and the job is still cancelled, its result not applied."""
    dsn, counts = private_pg.dsn, tmp_path / "counts"
    counts.mkdir()
    [stubborn] = enqueue(dsn, "stubborn", 1, {"sleep": 3})
    [other] = enqueue(dsn, "quick", 1, {"n": 3})
    proc = start_worker(dsn, tmp_path / "outbox", counts, *FAST, "--cancel-grace", "120", procs=1,
                        app="cancel_app")
    wait_for(lambda: started(counts, stubborn), 30, "the handler running")
    assert jobs.cancel(dsn, [stubborn]) == 1
    private_pg.stop("immediate")

    def outcome_waiting() -> bool:
        if not list(counts.glob("finished-*.log")):
            return False
        out = subprocess.run([sys.executable, "-m", "shardworker", "outbox", "status", "--json", "--outbox-dir",
                              str(tmp_path / "outbox")], env=worker_env(counts), capture_output=True, text=True)
        return int(json.loads(out.stdout)["pending"]) >= 1

    wait_for(outcome_waiting, 30, "the handler's outcome waiting in the outbox")
    private_pg.start()
    proc.send_signal(signal.SIGTERM)
    assert exit_code(proc, 90, counts) == 0, worker_log(counts)
    assert row(dsn, stubborn) == ("cancelled", None, 1)
    assert row(dsn, other)[0] == "done"
    assert runs(counts)[(stubborn, 1)] == 1 and sum(runs(counts).values()) == 2


def test_a_cancel_stops_the_attempt_it_cancelled_not_the_retry_that_follows(pg_dsn: str, tmp_path: Path) -> None:
    """Cancelled, then retried at once (one transaction: the worker hears both together): the
    cancel named only the job, so the worker stopped every attempt of it it held, the retry's
    too, and the retry ended cancelled or charged (found by a new user). Now the first attempt
    stops and the second runs to its end."""
    job_id, proc, counts = running(pg_dsn, tmp_path, "polite")
    import psycopg

    with psycopg.connect(pg_dsn) as conn:  # one commit: both notifications arrive together
        assert jobs.cancel(conn, [job_id]) == 1
        assert jobs.retry(conn, [job_id]) == 1
    wait_for(lambda: row(pg_dsn, job_id)[0] in ("done", "cancelled", "failed"), 30, "the retry ending")
    wait_for(lambda: f"{job_id} polled" in stopped(counts), 15, "the first attempt stopped")
    proc.send_signal(signal.SIGTERM)
    assert exit_code(proc, 60, counts) == 0, worker_log(counts)
    assert row(pg_dsn, job_id) == ("done", "finished", 2), worker_log(counts)
    assert stopped(counts) == [f"{job_id} polled"]
    assert runs(counts)[(job_id, 1)] == 1 and runs(counts)[(job_id, 2)] == 1
    kept = (tmp_path / "outbox" / "stale.jsonl").read_text()  # the first attempt's "stopped early"
    assert "newer attempt" in kept and "rescued and" not in kept, kept  # it read "was rescued" (a trial)
    assert query(pg_dsn, "SELECT errors FROM shardworker.jobs WHERE id = %s", job_id) == [(None,)] or \
        all(e["attempt"] < 2 for e in query(pg_dsn, "SELECT errors FROM shardworker.jobs WHERE id = %s", job_id)[0][0])


def test_a_cancelled_multi_step_attempt_leaves_its_next_steps_to_the_retry(pg_dsn: str, tmp_path: Path) -> None:
    """A threaded handler of three 1.5 s steps, cancelled and retried at once during its first
    step: the cancelled attempt went on into the next steps while the retry ran them too, so
    every step ran twice (found by a new user). Only the step running at the cancel may run
    twice (work in hand); the others run once, in the retry."""
    from tests.steps.step_ledger import step_runs

    counts = tmp_path / "counts"
    counts.mkdir()
    [job_id] = enqueue(pg_dsn, "extract_threads", 1, {"sleep": 1.5})
    proc = start_worker(pg_dsn, tmp_path / "outbox", counts, *FAST, procs=1, app="steps_app")
    wait_for(lambda: step_runs(counts)[(job_id, "fetch")] == 1, 30, "the first step running")
    import psycopg

    with psycopg.connect(pg_dsn) as conn:
        assert jobs.cancel(conn, [job_id]) == 1
        assert jobs.retry(conn, [job_id]) == 1
    wait_for(lambda: row(pg_dsn, job_id)[0] == "done", 60, "the retry done")
    time.sleep(2.0)  # long enough for the cancelled attempt to reach its next step, if it would
    proc.send_signal(signal.SIGTERM)
    assert exit_code(proc, 60, counts) == 0, worker_log(counts)
    ran = step_runs(counts)
    assert ran[(job_id, "ocr")] == 1 and ran[(job_id, "chunk")] == 1, ran
