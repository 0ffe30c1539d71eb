"""No input of any size stops a worker (issue 41, 1). A retried job whose first attempt
recorded five steps of 55 MB, and a merge after five results of 55 MB, each bring more than
PostgreSQL can gather in one jsonb value (256 MB) and more than a run may be given
(``shardworker.core.limits.MAX_JOB_INPUT_BYTES``): each fails for good, with the sizes on the
job, and the quick jobs queued behind them all run. Before, the retry's claim failed and the
worker exited 1 on every start."""

from __future__ import annotations

import signal
from pathlib import Path

from shardworker.client import JobSpec, enqueue_many
from shardworker.core.limits import MAX_JOB_INPUT_BYTES
from shardworker.embedded import EmbeddedPostgres
from tests.helpers import exit_code, query, runs, start_worker, wait_for, worker_log


def test_steps_and_dependency_results_over_the_budget_fail_their_job_and_the_rest_runs(
        private_pg: EmbeddedPostgres, tmp_path: Path) -> None:
    dsn, counts = private_pg.dsn, tmp_path / "counts"
    counts.mkdir()
    (big,) = enqueue_many(dsn, [JobSpec("big_steps")])
    producers = enqueue_many(dsn, [JobSpec("produce") for _ in range(5)])
    (merge,) = enqueue_many(dsn, [JobSpec("merge", after=producers)])
    quick = enqueue_many(dsn, [JobSpec("quick") for _ in range(20)])
    proc = start_worker(dsn, tmp_path / "outbox", counts, procs=2, app="large_app")
    try:
        wait_for(lambda: proc.poll() is not None or query(
            dsn, "SELECT count(*) FROM shardworker.jobs WHERE status NOT IN ('done', 'failed', 'cancelled')")
            == [(0,)], 240, "every job to end")
    finally:
        proc.send_signal(signal.SIGTERM)
    assert exit_code(proc, 60, counts) == 0, worker_log(counts)[-3000:]
    rows = {job_id: (status, error) for job_id, status, error in
            query(dsn, "SELECT id, status, last_error FROM shardworker.jobs")}
    assert all(rows[job_id] == ("done", None) for job_id in quick + producers), rows
    for job_id, what in ((big, "its recorded steps hold"), (merge, "the results of the jobs it waited on hold")):
        status, error = rows[job_id]
        assert status == "failed" and what in error and "MAX_JOB_INPUT_BYTES" in error, rows[job_id]
        assert f"{MAX_JOB_INPUT_BYTES:,}" in error
    ran = runs(counts)
    assert ran[(big, 1)] == 1 and (big, 2) not in ran and (merge, 1) not in ran
