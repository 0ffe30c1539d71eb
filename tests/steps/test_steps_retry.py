"""job.step across retries, through a real worker and PostgreSQL: a step that returned never
runs again for its job, whichever lane runs the handler."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.helpers import enqueue, exit_code, query, runs_per_job, start_worker, wait_for, worker_env
from tests.steps.step_ledger import STEPS, assert_steps_once, step_runs, steps_of
from tests.worker.test_observability import scrape

KINDS = ["extract", "extract_threads", "agent"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_failure_after_a_step_retries_without_running_it_again(pg_dsn: str, tmp_path: Path, kind: str) -> None:
    """The handler fails after its second step on the first attempt: the retry gets the first
    two steps' results back and runs only the third."""
    outbox_dir, count_dir = tmp_path / "outbox", tmp_path / "counts"
    count_dir.mkdir()
    ids = enqueue(pg_dsn, kind, 6, {"fail_after": "ocr"})
    proc = start_worker(pg_dsn, outbox_dir, count_dir, "--exit-when-idle", app="steps_app")
    assert exit_code(proc, 60, count_dir) == 0
    assert all(n == 2 for n in runs_per_job(count_dir).values())  # the handler ran twice, its steps once
    assert_steps_once(pg_dsn, count_dir, ids)
    assert [attempt for _, attempt in steps_of(pg_dsn, ids[0])] == [1, 1, 2]


@pytest.mark.parametrize("reset", [False, True])
def test_jobs_retry_keeps_steps_unless_told_to_forget_them(pg_dsn: str, tmp_path: Path, reset: bool) -> None:
    """A job failed for good after two steps; `jobs retry` runs it again replaying them, while
    `jobs retry --reset-steps` runs every step again."""
    outbox_dir, count_dir = tmp_path / "outbox", tmp_path / "counts"
    count_dir.mkdir()
    [job_id] = enqueue(pg_dsn, "extract_once", 1, {"fail_after": "ocr"})
    assert exit_code(start_worker(pg_dsn, outbox_dir, count_dir, "--exit-when-idle", app="steps_app"), 60,
                     count_dir) == 0
    assert query(pg_dsn, "SELECT status FROM shardworker.jobs")[0][0] == "failed"
    retried = subprocess.run([sys.executable, "-m", "shardworker", "jobs", "retry", str(job_id), "--dsn", pg_dsn,
                              *(["--reset-steps"] if reset else [])], env=worker_env(count_dir),
                             capture_output=True, text=True, timeout=60)
    assert retried.returncode == 0, retried.stderr
    assert exit_code(start_worker(pg_dsn, outbox_dir, count_dir, "--exit-when-idle", app="steps_app"), 60,
                     count_dir) == 0
    ran = step_runs(count_dir)
    assert [ran[(job_id, name)] for name in STEPS] == ([2, 2, 1] if reset else [1, 1, 1])
    assert query(pg_dsn, "SELECT status FROM shardworker.jobs")[0][0] == "done"
    assert [attempt for _, attempt in steps_of(pg_dsn, job_id)] == ([2, 2, 2] if reset else [1, 1, 2])


def test_the_metrics_count_steps_recorded_and_replayed(pg_dsn: str, tmp_path: Path) -> None:
    """Four jobs fail after two steps, then finish: 12 steps recorded, 8 replayed."""
    count_dir, port = tmp_path / "counts", free_port()
    count_dir.mkdir()
    ids = enqueue(pg_dsn, "extract", 4, {"fail_after": "ocr"})
    proc = start_worker(pg_dsn, tmp_path / "outbox", count_dir, "--metrics-port", str(port), app="steps_app")
    wait_for(lambda: query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE status = 'done'")[0][0] == len(ids),
             60, "the jobs done")
    metrics = scrape(port)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert metrics[("shardworker_steps_recorded_total", (("kind", "extract"),))] == 12
    assert metrics[("shardworker_steps_replayed_total", (("kind", "extract"),))] == 8
