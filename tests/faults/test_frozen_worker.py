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


def test_a_worker_whose_parent_froze_starts_no_new_step_once_a_peer_may_have_rescued_its_job(
        pg_dsn: str, tmp_path: Path) -> None:
    """Only A's parent freezes: its heartbeat stops, its child runs on. The child went on into
    the job's next steps after the rescue deadline while B, having rescued the job, ran them too
    (found by a new user). Now a step not recorded yet waits for the start gate, as a job start
    does: A's child starts no step after B began the job's second attempt, and, thawed and told
    it was rescued, A stops without running the step it held back."""
    counts = tmp_path / "counts"
    counts.mkdir()
    [job_id] = enqueue(pg_dsn, "extract", 1, {"sleep": 5})  # 3 steps of 5 s: the last begins past the deadline
    a = start_worker(pg_dsn, tmp_path / "a", counts, *RESCUE, "--worker-id", "host-a", procs=1,
                     log_path=tmp_path / "a.log", app="steps_app")
    wait_for(lambda: any(counts.glob("steps-*.log")), 30, "A's child in the first step")
    [a_ledger] = list(counts.glob("steps-*.log"))
    b = start_worker(pg_dsn, tmp_path / "b", counts, *RESCUE, "--worker-id", "host-b", procs=1,
                     log_path=tmp_path / "b.log", app="steps_app")
    wait_for(lambda: "ready:" in (tmp_path / "b.log").read_text(), 30, "B ready")
    os.kill(a.pid, signal.SIGSTOP)  # the parent alone: its child and flusher go on
    try:
        wait_for(lambda: status_counts(pg_dsn) == {"done": 1}, 90, "B running the rescued job to its end")
    finally:
        os.kill(a.pid, signal.SIGCONT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        a.wait(30)
    b.send_signal(signal.SIGTERM)
    assert b.wait(30) == 0, (tmp_path / "b.log").read_text()
    def starts(paths: list[Path]) -> list[int]:  # when each step function began (ns), from the ledgers
        return [int(at) for path in paths for _, _, event, at in map(str.split, path.read_text().splitlines())
                if event == "run"]

    b_starts = starts([p for p in counts.glob("steps-*.log") if p != a_ledger])
    assert b_starts, "B ran no step of the rescued job"
    late = [at for at in starts([a_ledger]) if at > min(b_starts)]
    assert not late, (f"A's child started {len(late)} step(s) after B began the job's next attempt",
                      (tmp_path / "a.log").read_text()[-2000:])
    assert query(pg_dsn, "SELECT status, attempt FROM shardworker.jobs WHERE id = %s", job_id) == [("done", 2)]
