"""A kill -9 of the whole worker, then a restart: the jobs its children held but never
started go back uncharged; only jobs whose handler had started may be charged.

Each child's progress slots live in ``progress-<shard>.bin`` of the outbox directory, so they
outlive the processes; the next start trusts them only when ``progress-boot`` names this
boot (``shardworker.worker.started``)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import (
    enqueue,
    exit_code,
    kill_worker_group,
    query,
    runs,
    runs_per_job,
    start_worker,
    status_counts,
    wait_for,
    worker_log,
)

JOBS = 200
# Sync handlers sleeping 0.1 s, each child holding up to 40 more than it runs.
ARGS = ("--prefetch", "40", "--backoff-cap", "1")


def kill_mid_run(dsn: str, outbox_dir: Path, count_dir: Path) -> set[int]:
    """Run max_attempts=1 jobs on two children, kill -9 the whole worker while they hold
    jobs they have not started; returns the ids of the jobs whose handler had started."""
    enqueue(dsn, "slow", JOBS, {"sleep": 0.1}, max_attempts=1)
    proc = start_worker(dsn, outbox_dir, count_dir, *ARGS, procs=2)
    wait_for(lambda: len(runs(count_dir)) >= 20, 60, "some handlers to run")
    kill_worker_group(proc)
    held = status_counts(dsn).get("running", 0)
    started = {job_id for job_id, _ in runs(count_dir)}
    assert held > len(started) - status_counts(dsn).get("done", 0) + 10, "the children held no unstarted jobs"
    return started


def restart(dsn: str, outbox_dir: Path, count_dir: Path) -> dict[int, str]:
    proc = start_worker(dsn, outbox_dir, count_dir, *ARGS, "--exit-when-idle", procs=2)
    assert exit_code(proc, 120, count_dir) == 0, worker_log(count_dir)
    return dict(query(dsn, "SELECT id, status FROM shardworker.jobs"))


def test_jobs_never_started_go_back_uncharged(pg_dsn: str, tmp_path: Path) -> None:
    """Every job whose handler never ran before the kill ends done, run once; only jobs whose
    handler had started may end failed (their one attempt charged)."""
    dsn, outbox_dir, count_dir = pg_dsn, tmp_path / "outbox", tmp_path / "counts"
    count_dir.mkdir()
    started = kill_mid_run(dsn, outbox_dir, count_dir)
    statuses = restart(dsn, outbox_dir, count_dir)
    wrongly_failed = [j for j, s in statuses.items() if s == "failed" and j not in started]
    assert not wrongly_failed, f"{len(wrongly_failed)} jobs that never started were charged: {wrongly_failed[:5]}"
    assert all(s in ("done", "failed") for s in statuses.values())
    per_job = runs_per_job(count_dir)
    assert all(per_job[j] == 1 for j, s in statuses.items() if j not in started), "an unstarted job ran twice"
    assert "never started, given back uncharged" in worker_log(count_dir)
    assert (outbox_dir / "progress-0.bin").stat().st_mode & 0o777 == 0o600


def test_progress_of_another_boot_is_not_trusted(pg_dsn: str, tmp_path: Path) -> None:
    """With the boot id beside the progress files changed (as after a reboot), nothing in them
    is trusted: every orphan is charged, as before progress files existed."""
    dsn, outbox_dir, count_dir = pg_dsn, tmp_path / "outbox", tmp_path / "counts"
    count_dir.mkdir()
    started = kill_mid_run(dsn, outbox_dir, count_dir)
    (outbox_dir / "progress-boot").write_text("another-boot\n")
    statuses = restart(dsn, outbox_dir, count_dir)
    never_started = [j for j, s in statuses.items() if s == "failed" and j not in started]
    assert len(never_started) >= 10, "orphans that never started were released although the boot id differs"
    assert "0 never started, given back uncharged" in worker_log(count_dir)
