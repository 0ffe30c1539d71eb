"""A worker that freezes instead of dying: SIGSTOP to its whole process group, as a hung host,
a VM paused by its hypervisor or a process stuck in the kernel. Its database sessions stay open
(the server sees nothing wrong), so nothing that lasts as long as a session may hold back the
rescue of its jobs by a peer that watched it go silent."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from tests.helpers import enqueue, query, runs, start_worker, status_counts, wait_for, worker_log

RESCUE = ("--rescue-after", "5", "--shutdown-timeout", "2", "--rescue-grace", "0")


def running_under(dsn: str, worker_id: str) -> int:
    return int(query(dsn, "SELECT count(*) FROM shardworker.jobs WHERE status = 'running' AND locked_by = %s",
                     worker_id)[0][0])


def test_a_frozen_worker_is_rescued_by_a_peer_that_started_after_it(pg_dsn: str, tmp_path: Path) -> None:
    """A starts first and claims every job, then freezes mid-handler, holding the rest unstarted;
    B, started after A, runs nothing of its own. B must rescue A's jobs after --rescue-after of
    watched silence and run them. Thawed, A must start none of the jobs it held (B ran them:
    they would run twice, their steps again), applies nothing over them (its attempt is stale),
    says it was rescued, and stops (exit 1: its supervisor restarts it afresh)."""
    counts = tmp_path / "counts"
    counts.mkdir()
    ids = enqueue(pg_dsn, "slow", 4, {"sleep": 2})
    a = start_worker(pg_dsn, tmp_path / "a", counts, *RESCUE, "--worker-id", "host-a", procs=1,
                     log_path=tmp_path / "a.log")
    wait_for(lambda: running_under(pg_dsn, "host-a") == 4 and len(runs(counts)) >= 1, 30, "A holding every job")
    b = start_worker(pg_dsn, tmp_path / "b", counts, *RESCUE, "--worker-id", "host-b", procs=1,
                     log_path=tmp_path / "b.log")
    wait_for(lambda: "ready:" in (tmp_path / "b.log").read_text(), 30, "B ready")
    os.killpg(a.pid, signal.SIGSTOP)
    started_by_a = set(runs(counts))  # the one A is running: it finishes after the thaw, stale
    try:
        wait_for(lambda: running_under(pg_dsn, "host-a") == 0, 30, "B rescuing the frozen A's jobs")
        wait_for(lambda: status_counts(pg_dsn) == {"done": 4}, 60, "B running the rescued jobs")
    finally:
        os.killpg(a.pid, signal.SIGCONT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        a.wait(30)
    assert a.returncode == 1, (tmp_path / "a.log").read_text()
    assert "rescued" in (tmp_path / "a.log").read_text()
    b.send_signal(signal.SIGTERM)
    assert b.wait(30) == 0, (tmp_path / "b.log").read_text()
    assert "rescued" in (tmp_path / "b.log").read_text()
    rows = query(pg_dsn, "SELECT id, status, attempt FROM shardworker.jobs ORDER BY id")
    assert [(job_id, status) for job_id, status, _ in rows] == [(job_id, "done") for job_id in ids]
    ran = runs(counts)
    assert all(n == 1 for n in ran.values()), ("an attempt ran twice", worker_log(counts))
    late = {key for key in ran if key[1] == 1} - started_by_a
    assert not late, f"A, thawed, started jobs it held that B had run: {sorted(late)}"
