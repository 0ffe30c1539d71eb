"""1,000 waiting jobs hold nothing: with 500 asleep and 500 waiting for an event, a worker on
``--procs 2`` keeps the threads and database connections it had before they came, and runs a
workload of fast jobs beside them to the end; then one event wakes 500 at once, `jobs wake`
the other 500, and every job ends done, each handler run twice (to its wait, then past it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg

import shardworker
from shardworker import JobSpec
from tests.helpers import exit_code, query, runs_per_job, start_worker, wait_for


def threads_of(pid: int) -> int:
    """Threads of the worker's process tree (the parent, its children, the flusher)."""
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            if proc.name == str(pid) or int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                total += int((proc / "status").read_text().split("Threads:")[1].split()[0])
        except (OSError, IndexError, ValueError):
            continue
    return total


def connections(dsn: str) -> int:
    """Connections to the test's database, this query's own left out."""
    return query(dsn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                      "AND pid <> pg_backend_pid()")[0][0]


def counts(dsn: str) -> dict[str, int]:
    return dict(query(dsn, "SELECT status, count(*) FROM shardworker.jobs GROUP BY status"))


def test_a_thousand_waiting_jobs_hold_no_child_thread_or_connection(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    outbox_dir, count_dir = dirs
    proc = start_worker(pg_dsn, outbox_dir, count_dir, procs=2, app="waits_app")
    try:
        warm = shardworker.enqueue_many(pg_dsn, [JobSpec("fast") for _ in range(200)])
        wait_for(lambda: counts(pg_dsn).get("done", 0) == len(warm), 30, "the warm-up")
        threads, conns = threads_of(proc.pid), connections(pg_dsn)
        sleepers = shardworker.enqueue_many(pg_dsn, [JobSpec("nap", {"sleep": 3600}) for _ in range(500)])
        waiters = shardworker.enqueue_many(pg_dsn, [JobSpec("approval", {"order": 1000}) for _ in range(500)])
        wait_for(lambda: counts(pg_dsn).get("waiting", 0) == 1000, 60, "1,000 jobs waiting")
        assert threads_of(proc.pid) <= threads and connections(pg_dsn) <= conns
        fast = shardworker.enqueue_many(pg_dsn, [JobSpec("fast") for _ in range(2000)])
        wait_for(lambda: counts(pg_dsn).get("done", 0) == len(warm) + len(fast), 60, "the fast jobs beside them")
        assert counts(pg_dsn)["waiting"] == 1000
        assert threads_of(proc.pid) <= threads and connections(pg_dsn) <= conns
        with psycopg.connect(pg_dsn) as conn, conn.transaction():
            assert shardworker.send_event(conn, "approve:1000", "yes") == 500
        woke = subprocess.run([sys.executable, "-m", "shardworker", "jobs", "wake", *map(str, sleepers),
                               "--dsn", pg_dsn], capture_output=True, text=True, timeout=60, cwd=count_dir)
        assert woke.returncode == 0 and "500 jobs woken" in woke.stdout, woke.stderr
        wait_for(lambda: counts(pg_dsn) == {"done": 3200}, 60, "every job done")
    finally:
        proc.terminate()
        exit_code(proc, 30, count_dir)
    ran = runs_per_job(count_dir)
    assert {ran[i] for i in [*sleepers, *waiters]} == {2} and {ran[i] for i in [*warm, *fast]} == {1}
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE id = ANY(%s) AND result = "
                         "'{\"decision\": \"yes\"}'::jsonb", waiters) == [(500,)]


def test_two_workers_wake_each_sleeper_and_waiter_once(pg_dsn: str, tmp_path: Path) -> None:
    """Two live workers on one database, each with its housekeeping ending waits: 100 sleepers
    (1 s) and 100 event waiters beside fast jobs; every sleeper and waiter runs exactly twice."""
    count_dir = tmp_path / "counts"
    count_dir.mkdir()
    workers = [start_worker(pg_dsn, tmp_path / f"outbox-{n}", count_dir, procs=1, app="waits_app") for n in (1, 2)]
    try:
        sleepers = shardworker.enqueue_many(pg_dsn, [JobSpec("nap", {"sleep": 1}) for _ in range(100)])
        waiters = shardworker.enqueue_many(pg_dsn, [JobSpec("approval", {"order": 7}) for _ in range(100)])
        fast = shardworker.enqueue_many(pg_dsn, [JobSpec("fast") for _ in range(300)])
        wait_for(lambda: query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE wait_kind = 'event'")[0][0]
                 == 100, 60, "every waiter waiting")
        assert shardworker.send_event(pg_dsn, "approve:7", "ok") == 100
        wait_for(lambda: counts(pg_dsn) == {"done": 500}, 60, "every job done")
    finally:
        for proc in workers:
            proc.terminate()
        for proc in workers:
            exit_code(proc, 30, count_dir)
    ran = runs_per_job(count_dir)
    assert {ran[i] for i in [*sleepers, *waiters]} == {2} and {ran[i] for i in fast} == {1}
