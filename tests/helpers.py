"""Helpers for tests that run real workers: processes, counting, database polling."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from shardworker.core.config import ChildConfig, WorkerConfig

APPS_DIR = Path(__file__).parent / "apps"
REPO = Path(__file__).parent.parent


def worker_config(**overrides: Any) -> WorkerConfig:
    """A ``WorkerConfig`` with the defaults, for the parts tests build from it (a child's, the
    flusher's): no database or app is reached through it."""
    return WorkerConfig(**{"dsn": "postgresql://unused", "app_ref": "unused", **overrides})


def child_config(shard: int, outbox_dir: str, *, delay_s: float = 0.005, records: int = 64,
                 concurrency: int = 1, slots: int = 64, parent_pid: int | None = None) -> ChildConfig:
    """A child's settings as the tests of the child's loop and of the pool use them."""
    return worker_config(outbox_dir=outbox_dir, group_commit_max_delay_s=delay_s, group_commit_max_records=records,
                         segment_bytes=1 << 20, concurrency=concurrency, default_timeout_s=0.0).child_config(
        shard, parent_pid=os.getpid() if parent_pid is None else parent_pid, slots=slots)


def worker_env(count_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["SW_TEST_COUNT_DIR"] = str(count_dir)
    env["PYTHONPATH"] = os.pathsep.join([str(APPS_DIR), str(REPO), env.get("PYTHONPATH", "")])
    env.pop("SHARDWORKER_DSN", None)
    return env


STARTED: list[subprocess.Popen[bytes]] = []  # killed after each test (conftest), even a failed one


def start_worker(dsn: str, outbox_dir: Path, count_dir: Path, *args: str, procs: int = 2,
                 log_path: Path | None = None, app: str = "counting_app") -> subprocess.Popen[bytes]:
    """Start ``shardworker run --app APP`` (an app of ``tests/apps``) as a real subprocess in its own
    process group."""
    cmd = [sys.executable, "-m", "shardworker", "run", "--app", app, "--procs", str(procs),
           "--outbox-dir", str(outbox_dir), "--dsn", dsn, *args]
    log = open(log_path or (count_dir / "worker.log"), "ab")  # noqa: SIM115 (kept for the child's life)
    proc = subprocess.Popen(cmd, env=worker_env(count_dir), stdout=log, stderr=log, start_new_session=True)
    STARTED.append(proc)
    return proc


def kill_worker_group(proc: subprocess.Popen[bytes]) -> None:
    """kill -9 every process of the worker (parent, children, flusher)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def runs(count_dir: Path) -> collections.Counter[tuple[int, int]]:
    """How many times each (job id, attempt) ran."""
    counter: collections.Counter[tuple[int, int]] = collections.Counter()
    for path in count_dir.glob("runs-*.log"):
        for line in path.read_text().split("\n"):
            if line.strip():
                job_id, attempt = line.split()
                counter[(int(job_id), int(attempt))] += 1
    return counter


def runs_per_job(count_dir: Path) -> collections.Counter[int]:
    per_job: collections.Counter[int] = collections.Counter()
    for (job_id, _), n in runs(count_dir).items():
        per_job[job_id] += n
    return per_job


def query(dsn: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
        return conn.execute(sql, params or None).fetchall()


def execute(dsn: str, sql: str, *params: Any) -> int:
    """Run one statement that returns no rows; its row count."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
        return conn.execute(sql, params or None).rowcount


def status_counts(dsn: str) -> dict[str, int]:
    return {s: n for s, n in query(dsn, "SELECT status, count(*) FROM shardworker.jobs GROUP BY status")}


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str, step_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except psycopg.OperationalError:
            pass
        time.sleep(step_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def enqueue(dsn: str, kind: str, count: int, payload: Any = None, **options: Any) -> list[int]:
    from shardworker.client import JobSpec, enqueue_many

    enqueue_many(dsn, [JobSpec(kind, payload, **options) for _ in range(count)])
    return [r[0] for r in query(dsn, "SELECT id FROM shardworker.jobs WHERE kind = %s ORDER BY id", kind)]


def worker_log(count_dir: Path) -> str:
    path = count_dir / "worker.log"
    return path.read_text(errors="replace") if path.exists() else ""


def exit_code(proc: subprocess.Popen[bytes], timeout_s: float, count_dir: Path) -> int:
    """The worker's exit code; if it is still running after ``timeout_s``, kill it and
    fail with the tail of its log (a bare ``TimeoutExpired`` says nothing about why)."""
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        kill_worker_group(proc)
        tail = "\n".join(worker_log(count_dir).splitlines()[-40:])
        raise AssertionError(f"worker still running after {timeout_s}s; its log ends:\n{tail}") from None


def run_until_idle(dsn: str, dirs: tuple[Path, Path], *args: str, procs: int = 1, app: str = "counting_app",
                   timeout_s: float = 60.0) -> int:
    """Run ``shardworker run --exit-when-idle`` on ``dirs`` (outbox, counts: the ``dirs``
    fixture) until it exits; its exit code (a worker still running at ``timeout_s`` fails
    the test with its log)."""
    proc = start_worker(dsn, dirs[0], dirs[1], "--exit-when-idle", *args, procs=procs, app=app)
    return exit_code(proc, timeout_s, dirs[1])


@contextlib.contextmanager
def mounted_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``2m``, ``80m``) at ``mount`` (created), unmounted on the way out;
    the test is skipped where mounting is not allowed (not root, no privilege)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
