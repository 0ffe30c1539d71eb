"""A child process never imports psycopg: it holds no database connection, and importing
the driver costs each child's start about a tenth of a second."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO, enqueue, exit_code, query, start_worker


def test_import_shardworker_does_not_load_psycopg() -> None:
    """The package's public names (App, enqueue, wait_for, ...) import the store lazily."""
    code = "import sys, shardworker; print(sorted(m for m in sys.modules if m.startswith('psycopg')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_a_running_child_has_not_imported_psycopg(pg_dsn: str, tmp_path: Path) -> None:
    """A real worker's child reports its own ``sys.modules`` from inside a handler."""
    count_dir = tmp_path / "counts"
    count_dir.mkdir()
    [job_id] = enqueue(pg_dsn, "loaded_drivers", 1)
    proc = start_worker(pg_dsn, tmp_path / "outbox", count_dir, "--exit-when-idle", procs=1, app="modules_app")
    assert exit_code(proc, 60, count_dir) == 0
    [(status, result)] = query(pg_dsn, "SELECT status, result FROM shardworker.jobs WHERE id = %s", job_id)
    assert status == "done"
    assert result == {"psycopg": [], "store": []}
