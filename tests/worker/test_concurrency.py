"""Many jobs in flight per child (``async def`` and ``threads=True`` handlers) with the same
durability: real worker processes on a real PostgreSQL; handlers count their own runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.faults.test_faults import _worker_processes
from tests.helpers import (
    REPO,
    STARTED,
    enqueue,
    query,
    runs,
    runs_per_job,
    status_counts,
    wait_for,
    worker_env,
    worker_log,
)
from tests.worker.test_mission import acknowledged


def start(dsn: str, dirs: tuple[Path, Path], *args: str, procs: int = 2) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "shardworker", "run", "--app", "concurrent_app", "--procs", str(procs),
           "--outbox-dir", str(dirs[0]), "--dsn", dsn, *args]
    env = worker_env(dirs[1])
    log = open(dirs[1] / "worker.log", "ab")  # noqa: SIM115 (kept for the child's life)
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log, start_new_session=True, cwd=REPO)
    STARTED.append(proc)
    return proc


def test_sync_threaded_and_async_kinds_in_one_app(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """One app with all three lanes: every job runs once and lands done with its lane's result."""
    ids = {kind: enqueue(pg_dsn, kind, 150) for kind in ("wait_async", "wait_thread", "cpu")}
    proc = start(pg_dsn, dirs, "--concurrency", "20", "--exit-when-idle")
    assert proc.wait(90) == 0, worker_log(dirs[1])
    for kind, lane in (("wait_async", "async"), ("wait_thread", "threads"), ("cpu", "sync")):
        rows = query(pg_dsn, "SELECT status, result->>'lane' FROM shardworker.jobs WHERE id = ANY(%s)", ids[kind])
        assert rows == [("done", lane)] * 150
    assert set(runs_per_job(dirs[1]).values()) == {1} and len(runs_per_job(dirs[1])) == 450


def test_an_async_timeout_fails_only_its_job(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """An async handler over its timeout_s is cancelled and fails; the jobs beside it in the same
    child finish, and the child is not killed."""
    [late] = enqueue(pg_dsn, "async_timeout", 1, {"sleep": 30})
    others = enqueue(pg_dsn, "wait_async", 40, {"sleep": 0.3})
    proc = start(pg_dsn, dirs, "--concurrency", "50", "--exit-when-idle", procs=1)
    assert proc.wait(60) == 0, worker_log(dirs[1])
    [(status, error)] = query(pg_dsn, "SELECT status, last_error FROM shardworker.jobs WHERE id = %s", late)
    assert status == "failed" and error.startswith("timed out after 0.5s")
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE id = ANY(%s) AND status = 'done' "
                         "AND attempt = 1", others) == [(40,)]
    assert "worker process died" not in worker_log(dirs[1])


def test_a_per_kind_limit_holds_across_the_worker(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """concurrency=3 caps that kind's handlers in flight in the whole worker, whatever --concurrency says."""
    enqueue(pg_dsn, "capped", 40)
    proc = start(pg_dsn, dirs, "--concurrency", "50", "--exit-when-idle", procs=2)
    assert proc.wait(60) == 0, worker_log(dirs[1])
    now, peak = (int(x) for x in (dirs[1] / "capped.count").read_text().split())
    assert (now, peak) == (0, 3)
    assert status_counts(pg_dsn) == {"done": 40}


def test_kill_9_of_a_child_with_many_async_jobs_in_flight(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """A child killed with 50 handlers in flight: no job whose outcome was fsync'd runs again; nobody
    knows which of the others caused the death, so they are snoozed (``shardworker.worker.blame``): each
    runs again, alone, under a new attempt with none used up; every job ends done, and no handler
    ran twice for one attempt."""
    fast = enqueue(pg_dsn, "wait_async", 30, {"sleep": 0.05})
    slow = enqueue(pg_dsn, "wait_release", 50)
    proc = start(pg_dsn, dirs, "--concurrency", "100", "--prefetch", "10", procs=1)
    wait_for(lambda: len(runs(dirs[1])) == 80, 30, "all 80 handlers started")
    acked: set[tuple[int, int]] = set()  # every outcome seen durable (an applied segment may be deleted since)

    def fast_ones_durable() -> bool:
        acked.update(acknowledged(dirs[0]))
        return {(i, 1) for i in fast} <= acked

    wait_for(fast_ones_durable, 30, "the fast ones durable")
    [victim] = _worker_processes(proc.pid, _port(pg_dsn))["child"]
    os.kill(victim, signal.SIGKILL)
    (dirs[1] / "release").touch()
    wait_for(lambda: status_counts(pg_dsn) == {"done": 80}, 60, "every job done after the kill")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, worker_log(dirs[1])
    ran = runs(dirs[1])
    assert {k: n for k, n in ran.items() if k[0] in fast} == {(i, 1): 1 for i in fast}
    assert {(i, 1) for i in fast} <= acked
    assert {k: n for k, n in ran.items() if k[0] in slow} == {(i, a): 1 for i in slow for a in (1, 2)}
    assert query(pg_dsn, "SELECT DISTINCT attempt, max_attempts, snoozes, last_error FROM shardworker.jobs "
                         "WHERE id = ANY(%s)", slow) == [(2, 25, 1, None)]


def _port(dsn: str) -> int:
    return int(dsn.rsplit(":", 1)[1].split("/", 1)[0])


def test_shutdown_with_async_jobs_in_flight(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """SIGTERM with handlers in flight: they finish within --shutdown-timeout and land done; jobs
    never started go back to queued with their attempt undone; nothing stays running."""
    enqueue(pg_dsn, "wait_async", 60, {"sleep": 1.5})
    proc = start(pg_dsn, dirs, "--concurrency", "10", "--prefetch", "20", "--shutdown-timeout", "20", procs=1)
    wait_for(lambda: len(runs(dirs[1])) >= 10, 30, "handlers in flight")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(40) == 0, worker_log(dirs[1])
    counts = status_counts(pg_dsn)
    started = len(runs(dirs[1]))
    assert "running" not in counts and counts.get("done") == started, (counts, started)
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE status = 'queued' AND attempt = 0") == [
        (60 - started,)]
