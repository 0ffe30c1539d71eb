"""A child or the flusher that keeps dying right after it starts ends the worker with exit 1
and that process's last error, instead of restarting it forever. Real processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import enqueue, query, start_worker, worker_env, worker_log


def test_a_child_that_cannot_start_ends_the_worker_with_its_error(pg_dsn: str, tmp_path: Path) -> None:
    """An app that fails to import in every child spawned afresh (the first ones are forked, and
    run): once a job kills its child, the worker exits 1 naming the successor's error, and no job
    is left running."""
    enqueue(pg_dsn, "die", 1)
    enqueue(pg_dsn, "count", 20)
    cmd = [sys.executable, "-m", "shardworker", "run", "--app", "broken_in_child_app", "--procs", "2",
           "--outbox-dir", str(tmp_path / "outbox"), "--dsn", pg_dsn]
    result = subprocess.run(cmd, env=worker_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: child ") and "this app cannot start in a child" in last, last
    statuses = dict(query(pg_dsn, "SELECT status, count(*) FROM shardworker.jobs GROUP BY 1"))
    assert "running" not in statuses and sum(statuses.values()) == 21, statuses


def test_a_flusher_that_cannot_start_ends_the_worker_with_its_error(pg_dsn: str, tmp_path: Path) -> None:
    """A flusher dying at once on every start (its checkpoint path is a directory): exit 1 with its error."""
    outbox_dir, counts = tmp_path / "outbox", tmp_path / "counts"
    counts.mkdir()
    (outbox_dir / "checkpoint.json").mkdir(parents=True)
    enqueue(pg_dsn, "count", 5)
    proc = start_worker(pg_dsn, outbox_dir, counts, procs=1)
    assert proc.wait(120) == 1, worker_log(counts)
    last = worker_log(counts).strip().splitlines()[-1]
    assert last.startswith("error: the flusher died") and "IsADirectoryError" in last, last
