"""Whatever a handler does, its outcome is decodable and storable, and nothing finished is
lost because another job misbehaved. Real worker processes on a real PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import enqueue, query, run_until_idle, runs, worker_log


def job_state(dsn: str, job_id: int) -> tuple[str, int, str | None]:
    [(status, attempt, error)] = query(dsn, "SELECT status, attempt, last_error FROM shardworker.jobs WHERE id = %s",
                                       job_id)
    return status, attempt, error


def test_an_error_with_a_lone_surrogate_is_stored_escaped(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """An exception naming a file from os.listdir (a lone surrogate) fails its attempts normally; the
    other jobs in the same child are unaffected."""
    others = enqueue(pg_dsn, "count", 20)
    [bad] = enqueue(pg_dsn, "surrogate", 1)
    assert run_until_idle(pg_dsn, dirs) == 0, worker_log(dirs[1])
    status, attempt, error = job_state(pg_dsn, bad)
    assert (status, attempt) == ("failed", 2)
    assert error is not None and "report-\\udcff.pdf" in error
    assert runs(dirs[1])[(bad, 1)] == 1 and runs(dirs[1])[(bad, 2)] == 1
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE id = ANY(%s) AND status = 'done'",
                 others) == [(20,)]


def test_an_error_with_a_nul_byte_is_stored_escaped_and_retried(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """A NUL in an error message is escaped, so the attempt is retried instead of failing for good."""
    [bad] = enqueue(pg_dsn, "nul_error", 1)
    assert run_until_idle(pg_dsn, dirs) == 0, worker_log(dirs[1])
    status, attempt, error = job_state(pg_dsn, bad)
    assert (status, attempt) == ("failed", 2)
    assert error is not None and "bad byte \\x00 in input" in error


def test_an_infinite_retry_delay_means_do_not_retry(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """retry_delay returning inf fails the job for good on its first attempt instead of a record
    the flusher cannot decode."""
    [bad] = enqueue(pg_dsn, "inf_delay", 1)
    assert run_until_idle(pg_dsn, dirs) == 0, worker_log(dirs[1])
    status, attempt, error = job_state(pg_dsn, bad)
    assert (status, attempt) == ("failed", 1)
    assert error is not None and "never retry me" in error


def test_a_nan_retry_delay_falls_back_to_the_default_backoff(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """retry_delay returning NaN requeues the job after the default backoff (1 s +-25% for attempt 1).
    The shutdown timeout is shorter than that backoff, so ``--exit-when-idle`` leaves the retry queued
    instead of waiting for it (a retry due within the shutdown timeout would be waited for)."""
    [bad] = enqueue(pg_dsn, "nan_delay", 1)
    assert run_until_idle(pg_dsn, dirs, "--shutdown-timeout", "0.5") == 0, worker_log(dirs[1])
    sql = "SELECT status, attempt, extract(epoch FROM run_at - updated_at)::float8 FROM shardworker.jobs WHERE id = %s"
    [(status, attempt, delay)] = query(pg_dsn, sql, bad)
    assert (status, attempt) == ("queued", 1)
    assert 0.7 <= delay <= 1.3


def test_a_result_with_a_nul_fails_for_good_with_the_reason(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """A result jsonb cannot hold fails its job once, with the reason, rather than dead-lettering retries."""
    [bad] = enqueue(pg_dsn, "nul_result", 1)
    assert run_until_idle(pg_dsn, dirs) == 0, worker_log(dirs[1])
    status, attempt, error = job_state(pg_dsn, bad)
    assert (status, attempt) == ("failed", 1)
    assert error is not None and "NUL" in error


def test_failed_attempts_are_logged_with_kind_id_and_error(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """Each failed attempt logs one line (kind, id, attempt, the error's first line); the last one at
    ERROR, followed by its traceback: a retry's traceback goes only to the job's error history (and
    to the log at DEBUG), so a log of planned retries reads as one line each (issue 42, 8)."""
    [bad] = enqueue(pg_dsn, "fail", 1)
    assert run_until_idle(pg_dsn, dirs) == 0, worker_log(dirs[1])
    lines = [line for line in worker_log(dirs[1]).splitlines() if f"job {bad} (fail)" in line]
    assert len(lines) == 3, worker_log(dirs[1])
    assert worker_log(dirs[1]).count("Traceback (most recent call last)") == 1, worker_log(dirs[1])
    history = query(pg_dsn, "SELECT errors FROM shardworker.jobs WHERE id = %s", bad)[0][0]
    assert len(history) == 3 and all("Traceback" in (entry.get("traceback") or "") for entry in history), history
    assert "WARNING" in lines[0] and "attempt 1/3 failed, retrying" in lines[0]
    assert "ValueError: boom on attempt 1" in lines[0]
    assert "ERROR" in lines[2] and "attempt 3/3 failed for good: ValueError: boom on attempt 3" in lines[2]
