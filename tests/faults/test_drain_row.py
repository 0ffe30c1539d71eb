"""`outbox drain` of a worker killed mid-run: the drain heartbeats under the dead worker's id
while it applies the outcomes, and when it ends that row is gone; the jobs the worker was
running, which have no outcome, are requeued as the worker's next start would requeue them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import (
    enqueue,
    kill_worker_group,
    query,
    runs,
    start_worker,
    wait_for,
    worker_env,
)


def test_a_drain_of_a_killed_workers_outbox_leaves_no_worker_row(tmp_path: Path, pg_dsn: str) -> None:
    counts, outbox_dir = tmp_path / "counts", tmp_path / "outbox"
    counts.mkdir()
    enqueue(pg_dsn, "slow", 40, {"sleep": 0.3})
    worker = start_worker(pg_dsn, outbox_dir, counts, "--worker-id", "w-killed", "--concurrency", "1")
    wait_for(lambda: len(runs(counts)) >= 6, 60, "a few jobs run")
    kill_worker_group(worker)
    [(running,)] = query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE status = 'running'")
    assert running > 0  # the killed worker's jobs, some with an outcome in the outbox, some without

    def shardworker(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "shardworker", *args, "--dsn", pg_dsn], env=worker_env(counts),
                              capture_output=True, text=True, timeout=120)

    drained = shardworker("outbox", "drain", "--outbox-dir", str(outbox_dir), "--timeout", "60")
    assert drained.returncode == 0, drained.stderr
    assert json.loads(shardworker("workers", "--all", "--json").stdout) == []
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE status = 'running'") == [(0,)]
    requeued = query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE status = 'queued' AND attempt = 1 "
                             "AND last_error LIKE 'worker stopped while the job was running%%'")
    assert requeued[0][0] > 0
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE status = 'done'")[0][0] >= 1
