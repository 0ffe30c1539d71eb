"""The fault suite: real outages, kills, a full disk and corruption; each check able to fail.

Every scenario ends with the same check (``assert_promise``): every job done with its own
result, no (job, attempt) ran twice, nothing left running, and no job whose outcome was
acknowledged ran again.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from shardworker.cli.main import main as cli
from shardworker.embedded import EmbeddedPostgres
from tests.helpers import (
    enqueue,
    kill_worker_group,
    query,
    runs,
    runs_per_job,
    start_worker,
    status_counts,
    wait_for,
    worker_log,
)
from tests.worker.test_mission import acknowledged

FAST = ("--backoff-cap", "1", "--network-timeout", "3", "--prefetch", "500")  # work in hand at an outage
# What a kill -9 of a child may cost, re-run under a new attempt (never acknowledged): the
# handler running, and the outcomes finished but not yet fsync'd (the one being committed
# and the ones gathering for the next commit). How many gather depends on how long the
# disk takes to fsync, so where a test can name the jobs a kill may cost (those that had
# run and were not acknowledged) it passes them as ``may_rerun`` instead of this count.
IN_HAND_PER_CHILD = 3


def assert_promise(dsn: str, count_dir: Path, total: int, acked: set[tuple[int, int]] = frozenset(),
                   max_reruns: int = 0, may_rerun: set[int] | None = None) -> None:
    """The end-of-scenario check of durability.md: every job done with its own result, no
    handler run twice for one attempt, no acknowledged outcome's job run again, and at most
    ``max_reruns`` jobs run again (or, given ``may_rerun``, only those jobs)."""
    rows = query(dsn, "SELECT id, status, result FROM shardworker.jobs")
    assert len(rows) == total
    bad = [r for r in rows if r[1] != "done" or r[2] != {"id": r[0]}]
    assert not bad, f"{len(bad)} jobs not done with their own result, e.g. {bad[:3]}"
    ran = runs(count_dir)
    assert all(n == 1 for n in ran.values()), "a handler ran twice for one attempt"
    for job_id, attempt in acked:
        assert not [a for (j, a) in ran if j == job_id and a > attempt], f"acknowledged job {job_id} ran again"
    reran = [j for j, n in runs_per_job(count_dir).items() if n > 1]
    if may_rerun is None:
        assert len(reran) <= max_reruns, f"{len(reran)} jobs ran again: {sorted(reran)[:10]}"
    else:
        assert set(reran) <= may_rerun, f"jobs ran again that had not run unacknowledged: {sorted(set(reran) - may_rerun)}"




def test_repeated_short_outages_rerun_nothing(private_pg: EmbeddedPostgres, dirs: tuple[Path, Path]) -> None:
    """PostgreSQL restarted (immediate) three times during a run: zero re-runs, the worker rides it out."""
    dsn = private_pg.dsn
    enqueue(dsn, "slow", 600, {"sleep": 0.03})  # ~9 s of work on 2 children: outages land mid-run
    proc = start_worker(dsn, *dirs, *FAST, "--exit-when-idle", procs=2)
    wait_for(lambda: status_counts(dsn).get("done", 0) >= 10, 30, "the run under way")
    for _ in range(3):
        time.sleep(0.8)
        private_pg.stop("immediate")
        time.sleep(1.5)
        assert proc.poll() is None, worker_log(dirs[1])
        private_pg.start()
    assert proc.wait(90) == 0, worker_log(dirs[1])
    assert_promise(dsn, dirs[1], 600)


def _worker_processes(parent_pid: int, pg_port: int) -> dict[str, list[int]]:
    """The worker's processes by role, read from /proc: each names itself ``sw-ROLE``
    (``/proc/PID/comm``); a child never has a connection to PostgreSQL."""
    roles: dict[str, list[int]] = {"child": [], "flusher": []}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/comm") as f:
                name = f.read().strip()
        except (OSError, IndexError, ValueError):
            continue
        if ppid != parent_pid or not name.startswith("sw-"):
            continue
        flusher = name == "sw-flusher"
        assert flusher or pg_port not in _remote_ports(int(entry)), f"{name} (pid {entry}): a child connects"
        roles["flusher" if flusher else "child"].append(int(entry))
    return roles


def _alive(pid: int) -> bool:
    """Running (not a zombie, not gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _remote_ports(pid: int) -> set[int]:
    """Remote TCP ports of ``pid``'s sockets (IPv4)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        with open("/proc/net/tcp") as f:
            rows = [line.split() for line in f.readlines()[1:]]
    except OSError:
        return set()
    return {int(row[2].split(":")[1], 16) for row in rows if row[9] in inodes}


def test_random_kill9_of_children_flusher_and_parent(private_pg: EmbeddedPostgres, dirs: tuple[Path, Path]) -> None:
    """kill -9 of a child, the flusher or the whole worker at random instants, with restarts: only jobs in
    hand at a kill run again, at most once per kill per child."""
    dsn, rng = private_pg.dsn, random.Random(7)
    enqueue(dsn, "slow", 800, {"sleep": 0.005})
    procs, reruns_allowed = 2, 0
    proc, last_start = start_worker(dsn, *dirs, *FAST, procs=procs), 0
    for round_ in range(6):
        time.sleep(rng.uniform(0.5, 1.2))
        if status_counts(dsn).get("done", 0) == 800:
            break
        roles = _worker_processes(proc.pid, private_pg.port)
        victim = ["child", "flusher", "parent"][round_ % 3]
        if victim == "parent" or not roles[victim]:
            os.kill(proc.pid, signal.SIGKILL)  # the parent alone: its children must die with it
            proc.wait(10)
            reruns_allowed += procs * IN_HAND_PER_CHILD
            last_start = len(worker_log(dirs[1]))  # a worker killed while it started never said it was ready
            proc = start_worker(dsn, *dirs, *FAST, procs=procs)
        else:
            os.kill(rng.choice(roles[victim]), signal.SIGKILL)
            reruns_allowed += IN_HAND_PER_CHILD if victim == "child" else 0
    wait_for(lambda: status_counts(dsn) == {"done": 800}, 90, "all jobs done after the kills")
    # The last worker may still be starting (a killed worker's flusher can apply the last outcomes before it
    # dies): a SIGTERM before Python runs shardworker's first line kills any process, so wait for it to be up.
    wait_for(lambda: "parent INFO ready:" in worker_log(dirs[1])[last_start:], 30, "the last worker ready")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, worker_log(dirs[1])
    assert_promise(dsn, dirs[1], 800, max_reruns=reruns_allowed)


def test_parent_killed_alone_takes_its_children_and_flusher_with_it(
        private_pg: EmbeddedPostgres, dirs: tuple[Path, Path]) -> None:
    """kill -9 of the parent only: no child or flusher survives it, so no orphan finishes a job that a
    restarted worker has already requeued; the restart completes every job with no handler run twice."""
    dsn = private_pg.dsn
    enqueue(dsn, "slow", 6, {"sleep": 2})
    proc = start_worker(dsn, *dirs, *FAST, procs=2)
    wait_for(lambda: len(runs(dirs[1])) >= 2, 30, "slow handlers running")
    spawned = [pid for pids in _worker_processes(proc.pid, private_pg.port).values() for pid in pids]
    assert len(spawned) == 3
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    wait_for(lambda: not any(_alive(pid) for pid in spawned), 5, "the children and the flusher to die with the parent")
    proc = start_worker(dsn, *dirs, *FAST, "--exit-when-idle", procs=2)
    assert proc.wait(60) == 0, worker_log(dirs[1])
    rows = query(dsn, "SELECT id, status, result FROM shardworker.jobs")
    assert all(status == "done" and result == {"id": job_id} for job_id, status, result in rows)
    assert all(n == 1 for n in runs(dirs[1]).values()), "a handler ran twice for one attempt"
    assert "stale" not in worker_log(dirs[1]), "an orphan's outcome arrived after its job was requeued"


def test_kill_during_outage_then_drain_then_run_reruns_nothing(
        private_pg: EmbeddedPostgres, dirs: tuple[Path, Path]) -> None:
    """Whole worker killed during an outage; `outbox drain` after the database returns; a new run finishes
    the rest; no acknowledged job runs again."""
    dsn, (outbox_dir, count_dir) = private_pg.dsn, dirs
    enqueue(dsn, "slow", 300, {"sleep": 0.01})
    proc = start_worker(dsn, outbox_dir, count_dir, *FAST, procs=2)
    wait_for(lambda: status_counts(dsn).get("done", 0) >= 30, 30, "a first part done")
    private_pg.stop("immediate")
    wait_for(lambda: len(runs(count_dir)) >= 200, 60, "handlers finishing into the outbox")
    kill_worker_group(proc)
    acked = acknowledged(outbox_dir)
    unacknowledged = {job_id for job_id, _ in runs(count_dir)} - {job_id for job_id, _ in acked}
    private_pg.start()
    result = CliRunner().invoke(cli, ["outbox", "drain", "--outbox-dir", str(outbox_dir), "--dsn", dsn,
                                      "--timeout", "30"])
    assert result.exit_code == 0, result.output
    done_after_drain = status_counts(dsn).get("done", 0)
    assert done_after_drain >= len(acked) - 1
    proc = start_worker(dsn, outbox_dir, count_dir, *FAST, "--exit-when-idle", procs=2)
    assert proc.wait(60) == 0, worker_log(count_dir)
    # The drain, though its process (this one) lives on, is no live worker under that id.
    assert "watching it for" not in worker_log(count_dir)
    assert_promise(dsn, count_dir, 300, acked, may_rerun=unacknowledged)


def test_dead_host_is_rescued_and_its_outbox_drains_stale(private_pg: EmbeddedPostgres, tmp_path: Path) -> None:
    """Two hosts on one database; A dies for good holding jobs; B rescues them after --rescue-after; A's outbox,
    drained later, yields only stale outcomes that change nothing."""
    dsn = private_pg.dsn
    a_outbox, b_outbox, counts = tmp_path / "a", tmp_path / "b", tmp_path / "counts"
    counts.mkdir()
    enqueue(dsn, "slow", 200, {"sleep": 0.05})
    a = start_worker(dsn, a_outbox, counts, *FAST, "--worker-id", "host-a", "--rescue-after", "5",
                     "--shutdown-timeout", "2", procs=1)
    wait_for(lambda: "queued" not in status_counts(dsn) and len(runs(counts)) >= 5, 30, "A holds the jobs")
    b = start_worker(dsn, b_outbox, counts, *FAST, "--worker-id", "host-b", "--rescue-after", "5",
                     "--shutdown-timeout", "2", "--rescue-grace", "0", procs=2)
    time.sleep(1.0)
    private_pg.stop("immediate")  # A's last outcomes stay in its outbox, unapplied
    time.sleep(0.5)
    kill_worker_group(a)
    a_acked = acknowledged(a_outbox)
    private_pg.start()
    wait_for(lambda: status_counts(dsn) == {"done": 200}, 90, "B finishing A's rescued jobs")
    b.send_signal(signal.SIGTERM)
    assert b.wait(30) == 0, worker_log(counts)
    rescued = query(dsn, "SELECT count(*) FROM shardworker.jobs WHERE attempt = 2")[0][0]
    assert rescued > 0, "no job was rescued"
    before = query(dsn, "SELECT id, attempt, status, result FROM shardworker.jobs ORDER BY id")
    result = CliRunner().invoke(cli, ["outbox", "drain", "--outbox-dir", str(a_outbox), "--dsn", dsn,
                                      "--timeout", "30"])
    assert result.exit_code == 0, result.output
    assert query(dsn, "SELECT id, attempt, status, result FROM shardworker.jobs ORDER BY id") == before
    assert " 0 applied" in result.output and "stale" in result.output
    assert a_acked, "A had acknowledged outcomes in its outbox"


def test_outage_longer_than_rescue_after_rescues_nobody(private_pg: EmbeddedPostgres, tmp_path: Path) -> None:
    """Two workers cut off by the same outage (longer than --rescue-after): nobody's jobs are rescued."""
    dsn, counts = private_pg.dsn, tmp_path / "counts"
    counts.mkdir()
    enqueue(dsn, "slow", 400, {"sleep": 0.02})
    args = (*FAST, "--rescue-after", "5", "--shutdown-timeout", "2", "--exit-when-idle")
    a = start_worker(dsn, tmp_path / "a", counts, *args, "--worker-id", "host-a", procs=1)
    b = start_worker(dsn, tmp_path / "b", counts, *args, "--worker-id", "host-b", procs=1)
    wait_for(lambda: status_counts(dsn).get("done", 0) >= 20, 30, "both working")
    private_pg.stop("immediate")
    time.sleep(7)
    private_pg.start()
    assert a.wait(90) == 0 and b.wait(90) == 0, worker_log(counts)
    assert query(dsn, "SELECT count(*) FROM shardworker.jobs WHERE last_error LIKE 'rescued%%'") == [(0,)]
    assert_promise(dsn, counts, 400)


def test_corrupt_segment_is_quarantined_and_other_shards_flow(
        private_pg: EmbeddedPostgres, dirs: tuple[Path, Path]) -> None:
    """A bit flip inside an acknowledged record: that segment is quarantined and reported by status and
    verify; the other shards' outcomes still apply."""
    from outbox.segment import list_segments, parse, read_file, segment_name

    dsn, (outbox_dir, count_dir) = private_pg.dsn, dirs
    enqueue(dsn, "slow", 200, {"sleep": 0.01})
    proc = start_worker(dsn, outbox_dir, count_dir, *FAST, procs=2)
    wait_for(lambda: status_counts(dsn).get("done", 0) >= 1, 30, "the worker working")
    private_pg.stop("immediate")
    wait_for(lambda: len(runs(count_dir)) == 200, 30, "all handlers ran into the outbox")
    time.sleep(0.3)
    kill_worker_group(proc)
    segs = list_segments(str(outbox_dir))
    path = outbox_dir / segment_name(0, segs[0][-1])
    frames = parse(read_file(str(path)), 0, segs[0][-1]).data
    assert len(frames) >= 20
    victim = frames[-10].offset + 30  # inside a record the flusher had not applied yet
    with open(path, "r+b") as f:
        f.seek(victim)
        byte = f.read(1)
        f.seek(victim)
        f.write(bytes([byte[0] ^ 0x40]))
    private_pg.start()
    runner = CliRunner()
    drained = runner.invoke(cli, ["outbox", "drain", "--outbox-dir", str(outbox_dir), "--dsn", dsn, "--timeout", "30"])
    assert drained.exit_code == 1 and "quarantined segment(s)" in drained.output, drained.output
    verify = runner.invoke(cli, ["outbox", "verify", "--outbox-dir", str(outbox_dir)])
    assert verify.exit_code == 1 and "quarantine/" in verify.output, verify.output
    status = runner.invoke(cli, ["outbox", "status", "--outbox-dir", str(outbox_dir)])
    assert "QUARANTINED" in status.output, status.output
    shard1 = {job_id for job_id, _ in acknowledged(outbox_dir)}  # shard 0's segment is gone now
    done = {r[0] for r in query(dsn, "SELECT id FROM shardworker.jobs WHERE status = 'done'")}
    assert shard1 <= done, "the healthy shard's outcomes did not apply"
    assert len(done) < 200, "outcomes of the quarantined segment applied"


def test_soak_command_exists() -> None:
    """The soak test is reachable with its README command (`python -m pytest -m soak`)."""
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "soak",
                             str(Path(__file__).parents[1])], capture_output=True, text=True)
    assert "test_soak" in result.stdout, result.stdout[-2000:]
