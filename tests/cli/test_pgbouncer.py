"""Through a real PgBouncer in transaction mode, as users run it: migrate, enqueue, a worker,
``jobs`` commands and the dashboard; every job exactly once. Without ``--listen-dsn`` the
worker polls and says so once; with it, it LISTENs on a direct connection."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shardworker.core.model import Outcome
from shardworker.store.migrate import apply_migrations
from shardworker.store.pg_store import PgStore, StoreConfig
from tests.dashboard.conftest import running_dashboard
from tests.helpers import exit_code, query, runs_per_job, start_worker, wait_for, worker_env, worker_log
from tests.pgbouncer import pgbouncer

JOBS = 300


@pytest.fixture
def bouncer_dsn(empty_dsn: str) -> Iterator[str]:
    """A brand-new database (no schema yet) reached through PgBouncer."""
    with pgbouncer(empty_dsn) as dsn:
        yield dsn


def cli(tmp_path: Path, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m shardworker ARGS`` as a subprocess; fails with its output unless it exits 0."""
    done = subprocess.run([sys.executable, "-m", "shardworker", *args], env=worker_env(tmp_path),
                          capture_output=True, text=True, timeout=timeout_s, cwd=tmp_path)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


def test_everything_through_a_transaction_pool(bouncer_dsn: str, empty_dsn: str, tmp_path: Path) -> None:
    cli(tmp_path, "migrate", "--dsn", bouncer_dsn)
    cli(tmp_path, "migrate", "--dsn", bouncer_dsn)  # again: its lock was let go
    cli(tmp_path, "enqueue", "count", '{"n": 1}', "--count", str(JOBS), "--dsn", bouncer_dsn)
    proc = start_worker(bouncer_dsn, tmp_path / "outbox", tmp_path, "--exit-when-idle", procs=2)
    assert exit_code(proc, 60, tmp_path) == 0, worker_log(tmp_path)

    ids = [i for (i,) in query(empty_dsn, "SELECT id FROM shardworker.jobs WHERE status = 'done' ORDER BY id")]
    assert len(ids) == JOBS
    assert runs_per_job(tmp_path) == {i: 1 for i in ids}
    log = worker_log(tmp_path)
    assert log.count("polls") == 1, log

    assert f"{ids[0]}" in cli(tmp_path, "jobs", "list", "--dsn", bouncer_dsn).stdout
    assert "done" in cli(tmp_path, "jobs", "show", str(ids[0]), "--dsn", bouncer_dsn).stdout
    assert "done" in cli(tmp_path, "jobs", "wait", str(ids[-1]), "--dsn", bouncer_dsn).stdout
    cli(tmp_path, "jobs", "delete", str(ids[1]), "--dsn", bouncer_dsn)
    assert query(empty_dsn, "SELECT count(*) FROM shardworker.jobs") == [(JOBS - 1,)]

    with running_dashboard(bouncer_dsn, tmp_path) as board:
        for page in ("/", f"/jobs/{ids[0]}", "/live/overview"):
            answer = httpx.get(board.url + page, timeout=10)
            assert answer.status_code == 200, (page, answer.text[:500], board.output())


def test_nothing_is_prepared_through_a_transaction_pool(bouncer_dsn: str) -> None:
    """Two workers' stores take turns on the pool's server connections: a statement one of
    them prepared would be missing, or already there, for the other."""
    apply_migrations(bouncer_dsn)
    stores = [PgStore(StoreConfig(dsn=bouncer_dsn, connect_timeout_s=3, statement_timeout_s=5)) for _ in range(2)]
    try:
        for n in range(12):
            store = stores[n % 2]
            assert store.enqueue("k", "null", queue="default", priority=0, max_attempts=3, run_at=None, delay_s=0,
                                 dedupe_key=None) is not None
            (job,) = store.claim(["k"], None, f"w{n % 2}", 1)
            assert store.apply_outcomes([Outcome.done(job.id, job.attempt, b"1")]).applied == 1
        with stores[0].cursor() as cur:
            assert stores[0].prepares(cur.connection) is False
    finally:
        for store in stores:
            store.close()


def test_listen_dsn_listens_on_a_direct_connection(bouncer_dsn: str, empty_dsn: str, tmp_path: Path) -> None:
    cli(tmp_path, "migrate", "--dsn", bouncer_dsn)
    proc = start_worker(bouncer_dsn, tmp_path / "outbox", tmp_path, "--listen-dsn", empty_dsn, procs=1)
    listeners = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'shardworker listen'"
    wait_for(lambda: query(empty_dsn, listeners) == [(1,)], 15, "the worker's listen connection")
    cli(tmp_path, "enqueue", "count", "{}", "--dsn", bouncer_dsn)
    wait_for(lambda: query(empty_dsn, "SELECT status FROM shardworker.jobs") == [("done",)], 15, "the job done")
    assert proc.poll() is None
    assert "polls" not in worker_log(tmp_path)


def test_enqueue_and_read_on_the_callers_own_connection(bouncer_dsn: str, tmp_path: Path) -> None:
    """psycopg prepares a statement run 5 times on a connection; through a transaction pool
    the next run lands on a server connection that never saw it, or that holds another
    client's statement of the same name. The library's calls on a caller's plain connection
    (default ``prepare_threshold``) never prepare."""
    import psycopg

    import shardworker
    from shardworker import jobs

    cli(tmp_path, "migrate", "--dsn", bouncer_dsn)
    with psycopg.connect(bouncer_dsn, autocommit=True) as one, psycopg.connect(bouncer_dsn, autocommit=True) as two:
        ids = [shardworker.enqueue(conn, "count", {"n": n}) for n in range(10) for conn in (one, two)]
        for job_id in ids:
            for conn in (one, two):
                assert jobs.get_job(conn, job_id) is not None


def test_jobs_wait_through_the_pool_sees_the_end_without_a_notification(bouncer_dsn: str, tmp_path: Path) -> None:
    """No notification comes through a transaction pool: ``jobs wait`` reads the row again
    every second instead of waiting out its --timeout."""
    cli(tmp_path, "migrate", "--dsn", bouncer_dsn)
    cli(tmp_path, "enqueue", "slow", '{"sleep": 1.5}', "--dsn", bouncer_dsn)
    start_worker(bouncer_dsn, tmp_path / "outbox", tmp_path, procs=1)
    started = time.monotonic()
    assert "done" in cli(tmp_path, "jobs", "wait", "1", "--timeout", "30", "--dsn", bouncer_dsn).stdout
    assert time.monotonic() - started < 10
