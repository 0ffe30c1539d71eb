"""A child process holds no database connection, and loads only what running handlers needs. ``import shardworker`` does not load
psycopg (a client that only enqueues through its own driver never pays for it); a worker's
children are forked before the parent imports the store, so they hold neither its modules
(about 13 MB a child) nor a connection."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg

from tests.conftest import free_port
from tests.helpers import REPO, enqueue, exit_code, query, start_worker, wait_for


def test_import_shardworker_does_not_load_psycopg() -> None:
    """The package's public names (App, enqueue, wait_for, ...) import the store lazily."""
    code = "import sys, shardworker; print(sorted(m for m in sys.modules if m.startswith('psycopg')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_a_running_child_holds_no_database_connection(pg_dsn: str, tmp_path: Path) -> None:
    """A real worker's child reports, from inside a handler, its sockets to the database's
    port and the psycopg connections alive in it: none, while its parent holds several."""
    count_dir = tmp_path / "counts"
    count_dir.mkdir()
    port = psycopg.conninfo.conninfo_to_dict(pg_dsn)["port"]
    [job_id] = enqueue(pg_dsn, "database_holdings", 1, {"port": int(port)})
    proc = start_worker(pg_dsn, tmp_path / "outbox", count_dir, "--exit-when-idle", procs=1, app="modules_app")
    assert exit_code(proc, 60, count_dir) == 0
    [(status, result)] = query(pg_dsn, "SELECT status, result FROM shardworker.jobs WHERE id = %s", job_id)
    assert status == "done"
    assert result == {"sockets": 0, "connections": 0}


def test_a_forked_child_never_loaded_the_driver(pg_dsn: str, tmp_path: Path) -> None:
    """A first start's child, forked from the parent, has no psycopg module and no libpq mapped."""
    count_dir = tmp_path / "counts"
    count_dir.mkdir()
    [job_id] = enqueue(pg_dsn, "driver_loaded", 1)
    proc = start_worker(pg_dsn, tmp_path / "outbox", count_dir, "--exit-when-idle", procs=1, app="modules_app")
    assert exit_code(proc, 60, count_dir) == 0
    [(status, result)] = query(pg_dsn, "SELECT status, result FROM shardworker.jobs WHERE id = %s", job_id)
    assert status == "done"
    assert result == {"modules": 0, "libpq": 0}


def test_a_child_loads_neither_the_driver_nor_the_metrics_nor_the_dashboard(pg_dsn: str, tmp_path: Path) -> None:
    """With the metrics served (prometheus_client in the parent), a child's first job finds
    none of psycopg, prometheus_client, starlette, uvicorn or jinja2 imported: neither in the
    child forked at the start nor in the one spawned after a child ended (issue 42, 6)."""
    count_dir = tmp_path / "counts"
    count_dir.mkdir()
    [forked] = enqueue(pg_dsn, "heavy_modules", 1)
    proc = start_worker(pg_dsn, tmp_path / "outbox", count_dir, "--metrics-port", str(free_port()), procs=1,
                        app="modules_app")
    done = "SELECT status, result FROM shardworker.jobs WHERE id = %s"
    wait_for(lambda: query(pg_dsn, done, forked)[0][0] == "done", 60, "the forked child's job")
    [ended] = enqueue(pg_dsn, "exit_child", 1, max_attempts=1)
    wait_for(lambda: query(pg_dsn, done, ended)[0][0] == "failed", 60, "the child's end")
    spawned = enqueue(pg_dsn, "heavy_modules", 1)[-1]
    wait_for(lambda: query(pg_dsn, done, spawned)[0][0] == "done", 60, "the spawned child's job")
    proc.terminate()
    assert exit_code(proc, 60, count_dir) == 0
    assert query(pg_dsn, done, forked) == [("done", [])]
    assert query(pg_dsn, done, spawned) == [("done", [])]
