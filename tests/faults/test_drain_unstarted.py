"""`outbox drain` of a worker killed -9 with jobs prefetched: the jobs its children never
started are given back uncharged, as the worker's own next start would; only those that had
started are charged. Real worker, kill -9, the console's drain."""

from __future__ import annotations

import time
from pathlib import Path

from click.testing import CliRunner

from shardworker.cli.main import main as cli
from tests.helpers import enqueue, kill_worker_group, query, runs, start_worker, wait_for, worker_log


def test_drain_gives_back_uncharged_the_jobs_a_killed_worker_never_started(pg_dsn: str, tmp_path: Path) -> None:
    """200 one-attempt jobs of 0.2 s, prefetched by a one-child worker, killed -9 after a few
    ran. A drain charged every job left running an attempt: those never started ended failed
    without having run once (found by a new user). Now only the one running at the kill is
    charged; the others are queued again at attempt 0 and run once by the next worker."""
    outbox_dir, counts = tmp_path / "outbox", tmp_path / "counts"
    counts.mkdir()
    ids = enqueue(pg_dsn, "slow", 200, {"sleep": 0.2}, max_attempts=1)
    proc = start_worker(pg_dsn, outbox_dir, counts, "--prefetch", "500", procs=1)
    wait_for(lambda: len(runs(counts)) >= 3, 30, "a few jobs run")
    kill_worker_group(proc)
    time.sleep(0.2)
    result = CliRunner().invoke(cli, ["outbox", "drain", "--outbox-dir", str(outbox_dir), "--dsn", pg_dsn,
                                      "--timeout", "30"])
    assert result.exit_code == 0, result.output
    ran = {job_id for job_id, _ in runs(counts)}
    failed = {job_id for (job_id,) in query(pg_dsn, "SELECT id FROM shardworker.jobs WHERE status = 'failed'")}
    assert failed <= ran, f"jobs failed by the drain without ever running: {sorted(failed - ran)[:10]}"
    assert len(failed) <= 1, failed
    proc = start_worker(pg_dsn, outbox_dir, counts, "--exit-when-idle", "--prefetch", "500", procs=2)
    assert proc.wait(120) == 0, worker_log(counts)
    rows = dict(query(pg_dsn, "SELECT id, status FROM shardworker.jobs"))
    assert sum(1 for job_id in ids if rows[job_id] == "done") == len(ids) - len(failed)
    assert all(n == 1 for n in runs(counts).values()), "an attempt ran twice"
