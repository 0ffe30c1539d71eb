"""End-to-end tests of `shardworker run` as a real subprocess on a real PostgreSQL."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.helpers import (
    enqueue,
    exit_code,
    query,
    run_until_idle,
    runs,
    runs_per_job,
    start_worker,
    status_counts,
    wait_for,
    worker_log,
)


def test_jobs_run_once_each_and_store_results(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """Every job of a batch runs once through several children and lands done with its result."""
    ids = enqueue(pg_dsn, "count", 500, {"k": "v"})
    assert run_until_idle(pg_dsn, dirs, procs=3) == 0, worker_log(dirs[1])
    rows = query(pg_dsn, "SELECT id, status, result, attempt, locked_by FROM shardworker.jobs ORDER BY id")
    assert [r[0] for r in rows] == ids
    assert all(r[1] == "done" and r[2] == {"id": r[0], "echo": {"k": "v"}} and r[3] == 1 and r[4] is None
               for r in rows)
    assert set(runs_per_job(dirs[1]).values()) == {1}
    assert len(list(dirs[1].glob("runs-*.log"))) == 3  # every child got work


def test_exit_when_idle_waits_for_a_retry_due_within_the_shutdown_timeout(pg_dsn: str,
                                                                         dirs: tuple[Path, Path]) -> None:
    """A batch run finishes its retries: a failed attempt whose retry falls due within
    --shutdown-timeout (2 s here, of 30) keeps the worker until the job ends."""
    [job_id] = enqueue(pg_dsn, "fail_retry_in_2s", 1)
    assert run_until_idle(pg_dsn, dirs, "--shutdown-timeout", "30", procs=3) == 0, worker_log(dirs[1])
    assert query(pg_dsn, "SELECT status, attempt FROM shardworker.jobs") == [("failed", 2)]
    assert runs(dirs[1]) == {(job_id, 1): 1, (job_id, 2): 1}


def test_exit_when_idle_leaves_a_retry_due_after_the_shutdown_timeout_queued(pg_dsn: str,
                                                                             dirs: tuple[Path, Path]) -> None:
    """A retry an hour away is the next run's: the worker exits, the job stays queued."""
    [job_id] = enqueue(pg_dsn, "fail_retry_in_1h", 1)
    assert run_until_idle(pg_dsn, dirs, "--shutdown-timeout", "5", procs=3) == 0, worker_log(dirs[1])
    assert query(pg_dsn, "SELECT status, attempt FROM shardworker.jobs") == [("queued", 1)]
    assert runs(dirs[1]) == {(job_id, 1): 1}


def test_failing_handler_is_retried_then_failed(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """A raising handler is retried with backoff until max_attempts, then failed with last_error."""
    [job_id] = enqueue(pg_dsn, "fail", 1)
    assert run_until_idle(pg_dsn, dirs, procs=3) == 0, worker_log(dirs[1])
    [(status, attempt, error)] = query(pg_dsn, "SELECT status, attempt, last_error FROM shardworker.jobs")
    assert (status, attempt) == ("failed", 3)
    assert "ValueError: boom on attempt 3" in error and "Traceback" in error
    assert runs(dirs[1]) == {(job_id, 1): 1, (job_id, 2): 1, (job_id, 3): 1}


def test_unknown_kinds_are_not_claimed(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """A worker claims only kinds its App has handlers for."""
    enqueue(pg_dsn, "somebody_elses_kind", 5)
    enqueue(pg_dsn, "count", 5)
    assert run_until_idle(pg_dsn, dirs, procs=3) == 0, worker_log(dirs[1])
    rows = query(pg_dsn, "SELECT kind, status, attempt, count(*) FROM shardworker.jobs GROUP BY 1, 2, 3 ORDER BY 1")
    assert rows == [("count", "done", 1, 5), ("somebody_elses_kind", "queued", 0, 5)]


def test_child_killed_mid_job_is_restarted_and_job_completes(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """A child that dies mid-job is restarted; the job that was running alone in it fails that
    attempt, saying how the process died, and succeeds on the next."""
    [crash_id] = enqueue(pg_dsn, "crash_once", 1)
    others = enqueue(pg_dsn, "count", 50)
    assert run_until_idle(pg_dsn, dirs, procs=2) == 0, worker_log(dirs[1])
    [(status, attempt, result, error)] = query(
        pg_dsn, "SELECT status, attempt, result, last_error FROM shardworker.jobs WHERE id = %s", crash_id)
    assert (status, attempt, result) == ("done", 2, "survived")
    assert error == "the handler's process died: signal 9 (SIGKILL)"
    assert runs(dirs[1])[(crash_id, 1)] == 1 and runs(dirs[1])[(crash_id, 2)] == 1
    per_job = runs_per_job(dirs[1])
    assert all(per_job[i] == 1 for i in others), "a job on the dead child's shard ran twice"
    assert status_counts(pg_dsn) == {"done": 51}


def test_handler_timeout_kills_child_and_fails_the_attempt(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """A handler over its timeout is killed; that attempt fails and the retry finishes."""
    [job_id] = enqueue(pg_dsn, "hang", 1)
    assert run_until_idle(pg_dsn, dirs, procs=1, timeout_s=40) == 0, worker_log(dirs[1])
    [(status, attempt, error)] = query(pg_dsn, "SELECT status, attempt, last_error FROM shardworker.jobs")
    assert (status, attempt) == ("done", 2)
    assert "timed out after 1s" in error
    assert runs(dirs[1]) == {(job_id, 1): 1, (job_id, 2): 1}


def test_unserializable_result_fails_without_killing_the_child(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """A result orjson cannot encode is a failed outcome with a clear message, not a dead child."""
    enqueue(pg_dsn, "unserializable", 1, max_attempts=1)
    enqueue(pg_dsn, "count", 10)
    assert run_until_idle(pg_dsn, dirs, procs=1) == 0, worker_log(dirs[1])
    [(status, error)] = query(pg_dsn, "SELECT status, last_error FROM shardworker.jobs WHERE kind = 'unserializable'")
    assert status == "failed" and "not JSON-serializable" in error
    assert "worker process died" not in worker_log(dirs[1])


def test_sigterm_finishes_in_hand_releases_the_rest_and_loses_nothing(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """SIGTERM: jobs in hand finish, unstarted prefetched jobs go back to queued, no row stays running."""
    enqueue(pg_dsn, "slow", 400, {"sleep": 0.02})
    proc = start_worker(pg_dsn, dirs[0], dirs[1], procs=2)
    wait_for(lambda: status_counts(pg_dsn).get("done", 0) >= 20, 30, "some jobs done")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, worker_log(dirs[1])
    counts = status_counts(pg_dsn)
    assert "running" not in counts, counts
    assert counts.get("queued", 0) > 0, "expected unstarted jobs to be released"
    ran = runs(dirs[1])
    done = {r[0] for r in query(pg_dsn, "SELECT id FROM shardworker.jobs WHERE status = 'done'")}
    assert {job_id for job_id, _ in ran} == done, "a handler that returned lost its outcome"
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE status = 'queued' AND attempt <> 0") == [(0,)]


def test_restart_after_kill_requeues_unfinished_and_reruns_nothing_finished(
        pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """kill -9 of the whole worker, then a restart: acknowledged outcomes apply, only unfinished jobs re-run."""
    from tests.helpers import kill_worker_group

    enqueue(pg_dsn, "slow", 300, {"sleep": 0.01})
    proc = start_worker(pg_dsn, dirs[0], dirs[1], procs=2)
    wait_for(lambda: len(runs(dirs[1])) >= 60, 30, "some handlers ran")
    kill_worker_group(proc)
    assert run_until_idle(pg_dsn, dirs, procs=2) == 0, worker_log(dirs[1])
    assert status_counts(pg_dsn) == {"done": 300}
    per_attempt = runs(dirs[1])
    assert all(n == 1 for n in per_attempt.values()), "a handler ran twice for one attempt"
    reran = [job_id for job_id, n in runs_per_job(dirs[1]).items() if n > 1]
    # Only jobs in a child's hands at the kill can run again: per child, the running handler
    # and the outcomes not yet fsync'd (the commit in flight, and at most one finished
    # behind it while that fdatasync outlasts a 10 ms handler), so at most three per child.
    assert len(reran) <= 3 * 2, reran


def test_result_too_large_for_the_outbox_fails_the_job_cleanly(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """A result over the outbox's record limit fails that job (no retry) without killing the child."""
    enqueue(pg_dsn, "huge", 1)
    enqueue(pg_dsn, "count", 5)
    assert run_until_idle(pg_dsn, dirs, procs=1) == 0, worker_log(dirs[1])
    [(status, attempt, error)] = query(pg_dsn, "SELECT status, attempt, last_error FROM shardworker.jobs "
                                               "WHERE kind = 'huge'")
    assert (status, attempt) == ("failed", 1) and "too large" in error
    assert status_counts(pg_dsn) == {"done": 5, "failed": 1}
    assert "worker process died" not in worker_log(dirs[1])


def test_queued_jobs_of_a_kind_without_a_handler_are_named(pg_dsn: str, tmp_path: Path) -> None:
    """A typo in a kind would leave its jobs queued unseen: the worker names such kinds (with
    their queue, count and oldest) at its start and when it exits idle, claims none of them,
    and does not name its own kinds."""
    count_dir = tmp_path / "counts"
    count_dir.mkdir()
    enqueue(pg_dsn, "cuont", 3)
    enqueue(pg_dsn, "count", 2)
    proc = start_worker(pg_dsn, tmp_path / "outbox", count_dir, "--exit-when-idle")
    assert exit_code(proc, 60, count_dir) == 0
    log = worker_log(count_dir)
    named = [line for line in log.splitlines() if "queued jobs that no live worker handles" in line]
    assert len(named) == 2, log
    assert all("cuont (queue default): 3 queued, the oldest due" in line for line in named), named
    assert not any("count (queue" in line for line in named), named
    assert status_counts(pg_dsn) == {"queued": 3, "done": 2}
