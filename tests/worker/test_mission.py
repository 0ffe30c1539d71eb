"""The mission: a database outage pauses persistence; it never makes a finished job run again.

These stop the real PostgreSQL server (``pg_ctl stop -m immediate``) in the middle of a run.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from outbox.segment import list_segments, parse, read_file, segment_name
from shardworker.core.wire import outcome_key
from shardworker.embedded import EmbeddedPostgres
from tests.helpers import (
    enqueue,
    kill_worker_group,
    runs,
    runs_per_job,
    start_worker,
    status_counts,
    wait_for,
    worker_log,
)

BACKOFF_CAP_S = 1.0


def acknowledged(outbox_dir: Path) -> set[tuple[int, int]]:
    """(job id, attempt) of every outcome durable in the outbox."""
    found = set()
    for shard, segs in list_segments(str(outbox_dir)).items():
        for segno in segs:
            buf = read_file(str(outbox_dir / segment_name(shard, segno)))
            for frame in parse(buf, shard, segno).data:
                found.add(outcome_key(frame.payload))
    return found


def test_outage_longer_than_backoff_cap_reruns_nothing(private_pg: EmbeddedPostgres, tmp_path: Path) -> None:
    """PostgreSQL stopped mid-run for over the backoff cap: the worker stays up, every job ends done,
    and each handler ran exactly once."""
    dsn, count_dir = private_pg.dsn, tmp_path / "counts"
    count_dir.mkdir()
    enqueue(dsn, "slow", 400, {"sleep": 0.01})
    proc = start_worker(dsn, tmp_path / "outbox", count_dir, "--backoff-cap", str(BACKOFF_CAP_S),
                        "--prefetch", "250", procs=2)
    wait_for(lambda: status_counts(dsn).get("done", 0) >= 40, 30, "a first part done")
    private_pg.stop("immediate")
    down_at = time.monotonic()
    wait_for(lambda: len(runs(count_dir)) == 400, 60, "children to finish what they hold")
    time.sleep(max(0.0, 3 * BACKOFF_CAP_S - (time.monotonic() - down_at)))
    assert proc.poll() is None, "the worker exited during the outage:\n" + worker_log(count_dir)
    private_pg.start()
    wait_for(lambda: status_counts(dsn) == {"done": 400}, 60, "every job done after the outage")
    assert proc.poll() is None, worker_log(count_dir)
    assert set(runs_per_job(count_dir).values()) == {1}, "a handler ran again after the outage"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, worker_log(count_dir)


def test_worker_killed_during_outage_reruns_nothing_acknowledged(
        private_pg: EmbeddedPostgres, tmp_path: Path) -> None:
    """Whole worker kill -9'd while PostgreSQL is down, restarted after: no handler whose outcome was in the
    outbox runs again; every job ends done."""
    dsn, count_dir, outbox_dir = private_pg.dsn, tmp_path / "counts", tmp_path / "outbox"
    count_dir.mkdir()
    enqueue(dsn, "slow", 300, {"sleep": 0.01})
    proc = start_worker(dsn, outbox_dir, count_dir, "--backoff-cap", str(BACKOFF_CAP_S),
                        "--prefetch", "250", procs=2)
    wait_for(lambda: status_counts(dsn).get("done", 0) >= 30, 30, "a first part done")
    private_pg.stop("immediate")
    wait_for(lambda: len(runs(count_dir)) >= 200, 60, "handlers running into the outbox")
    kill_worker_group(proc)
    acked = acknowledged(outbox_dir)
    ran_before = runs(count_dir)
    assert len(acked) >= 150, "expected most outcomes waiting in the outbox"
    private_pg.start()
    restarted = start_worker(dsn, outbox_dir, count_dir, "--backoff-cap", str(BACKOFF_CAP_S),
                             "--prefetch", "250", "--exit-when-idle", procs=2)
    assert restarted.wait(90) == 0, worker_log(count_dir)
    assert status_counts(dsn) == {"done": 300}
    after = runs(count_dir)
    for job_id, attempt in acked:
        later = [a for (j, a) in after if j == job_id and a > attempt]
        assert not later, f"job {job_id} ran again (attempts {later}) though attempt {attempt} was acknowledged"
    assert all(n == 1 for n in after.values()), "a handler ran twice for one attempt"
    reran = sorted(j for j, n in runs_per_job(count_dir).items() if n > 1)
    assert all((j, 1) in ran_before and (j, 1) not in acked for j in reran)
    # In a child's hands at the kill: the running handler, the commit in flight and at most
    # one outcome finished behind it (the next handler never waits for an fsync).
    assert len(reran) <= 3 * 2, f"only jobs in hand at the kill (three per child) may run again, got {reran}"


def test_shutdown_during_an_outage_keeps_outcomes_and_says_how_to_drain(
        private_pg: EmbeddedPostgres, tmp_path: Path) -> None:
    """SIGTERM while PostgreSQL is down: exit 0, outcomes stay in the outbox, the message says how many and
    how to drain them; the next start applies them without re-running a handler."""
    dsn, count_dir, outbox_dir = private_pg.dsn, tmp_path / "counts", tmp_path / "outbox"
    count_dir.mkdir()
    enqueue(dsn, "slow", 100, {"sleep": 0.01})
    proc = start_worker(dsn, outbox_dir, count_dir, "--backoff-cap", str(BACKOFF_CAP_S),
                        "--shutdown-timeout", "3", procs=2)
    wait_for(lambda: status_counts(dsn).get("done", 0) >= 10, 30, "a first part done")
    private_pg.stop("immediate")
    wait_for(lambda: len(runs(count_dir)) >= 60, 30, "handlers finishing into the outbox")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, worker_log(count_dir)
    log = worker_log(count_dir)
    assert "outcomes remain in the outbox" in log and "shardworker outbox drain" in log, log
    acked = acknowledged(outbox_dir)
    private_pg.start()
    restarted = start_worker(dsn, outbox_dir, count_dir, "--exit-when-idle", procs=2)
    assert restarted.wait(60) == 0, worker_log(count_dir)
    assert status_counts(dsn) == {"done": 100}
    after = runs(count_dir)
    assert all(n == 1 for n in after.values())
    for job_id, attempt in acked:
        assert not [a for (j, a) in after if j == job_id and a > attempt], f"job {job_id} ran again"


def test_second_signal_exits_at_once(private_pg: EmbeddedPostgres, tmp_path: Path) -> None:
    """A second SIGTERM during a slow shutdown exits immediately (non-zero), leaving outcomes in the outbox."""
    dsn, count_dir = private_pg.dsn, tmp_path / "counts"
    count_dir.mkdir()
    enqueue(dsn, "slow", 20, {"sleep": 600})  # only the second signal can end this run within the wait
    proc = start_worker(dsn, tmp_path / "outbox", count_dir, "--shutdown-timeout", "900", procs=1)
    wait_for(lambda: len(runs(count_dir)) >= 1, 30, "a slow handler running")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert proc.poll() is None, "the first signal must wait for the job in hand"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 1


def test_a_stop_during_an_outage_with_nothing_in_hand_exits_at_once(private_pg: EmbeddedPostgres,
                                                                    tmp_path: Path) -> None:
    """An idle worker stopped while PostgreSQL is down exits in seconds, not --shutdown-timeout:
    claims refused at connect never reached the server, so there is nothing to give back; a
    claim cut off mid-statement may have, and is tried briefly (the next start requeues it)."""
    dsn, count_dir = private_pg.dsn, tmp_path / "counts"
    count_dir.mkdir()
    proc = start_worker(dsn, tmp_path / "outbox", count_dir, "--backoff-cap", "0.5", "--shutdown-timeout", "900")
    wait_for(lambda: "Traceback" not in worker_log(count_dir) and (tmp_path / "outbox").exists(), 30, "the start")
    time.sleep(1.5)
    private_pg.stop("immediate")
    wait_for(lambda: "database unreachable" in worker_log(count_dir), 30, "the worker to notice the outage")
    time.sleep(1.5)  # a few refused claims
    stopped_at = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(200) == 0, worker_log(count_dir)  # far from the 900 s --shutdown-timeout
    assert time.monotonic() - stopped_at < 200, worker_log(count_dir)
    assert "could not give back 0 unstarted jobs and 0 claims" not in worker_log(count_dir)


def test_a_stop_during_an_outage_with_outcomes_pending_exits_in_seconds(private_pg: EmbeddedPostgres,
                                                                        tmp_path: Path) -> None:
    """Outcomes waiting in the outbox when a stop comes during an outage: the worker waits for
    the database a few seconds, not --shutdown-timeout, and leaves them for its next start."""
    dsn, count_dir, outbox_dir = private_pg.dsn, tmp_path / "counts", tmp_path / "outbox"
    count_dir.mkdir()
    enqueue(dsn, "slow", 100, {"sleep": 0.01})
    proc = start_worker(dsn, outbox_dir, count_dir, "--backoff-cap", "0.5", "--shutdown-timeout", "900", procs=2)
    wait_for(lambda: status_counts(dsn).get("done", 0) >= 10, 30, "a first part done")
    private_pg.stop("immediate")
    wait_for(lambda: len(runs(count_dir)) >= 60, 30, "handlers finishing into the outbox")
    stopped_at = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(200) == 0, worker_log(count_dir)  # far from the 900 s --shutdown-timeout
    assert time.monotonic() - stopped_at < 200, worker_log(count_dir)
    assert "outcomes remain in the outbox" in worker_log(count_dir)
    private_pg.start()
    assert start_worker(dsn, outbox_dir, count_dir, "--exit-when-idle", procs=2).wait(60) == 0
    assert status_counts(dsn) == {"done": 100}
    assert set(runs_per_job(count_dir).values()) == {1}
