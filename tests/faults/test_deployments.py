"""The promise beyond one worker on one healthy database: two workers on one database (one
slow, one stopped, one shutting down), a failover that makes the database read-only, a
long handler in a child with finished outcomes waiting. Real processes, real PostgreSQL;
handlers count their own runs."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psycopg
from click.testing import CliRunner

from shardworker.cli.main import main as cli
from shardworker.embedded import EmbeddedPostgres
from tests.faults.test_faults import FAST, assert_promise
from tests.helpers import (
    enqueue,
    query,
    runs,
    runs_per_job,
    start_worker,
    status_counts,
    wait_for,
    worker_log,
)
from tests.worker.test_mission import acknowledged

# Quick to rescue the silent, and quick to be rescued: a peer waits the longer of its window and the silent one's.
PEER = ("--rescue-after", "5", "--shutdown-timeout", "1")


def test_a_slow_handler_neither_stalls_the_heartbeat_nor_hoards_jobs(pg_dsn: str, tmp_path: Path) -> None:
    """One long job ahead of many with 2 KB payloads in a one-child worker: its heartbeat never
    stops (a peer watching with --rescue-after 5 rescues nothing), and it holds only a prefetch's
    worth, so the peer runs most of the rest."""
    a_counts, b_counts = tmp_path / "a-counts", tmp_path / "b-counts"
    a_counts.mkdir()
    b_counts.mkdir()
    [slow] = enqueue(pg_dsn, "sleepy", 1, {"sleep": 10})
    enqueue(pg_dsn, "count", 600, {"pad": "x" * 2048})
    a = start_worker(pg_dsn, tmp_path / "a", a_counts, "--worker-id", "host-a", *PEER, procs=1)
    wait_for(lambda: runs(a_counts).get((slow, 1)) == 1, 30, "A running the long job")
    b = start_worker(pg_dsn, tmp_path / "b", b_counts, "--worker-id", "host-b", *PEER, "--rescue-grace", "0",
                     procs=1)
    wait_for(lambda: status_counts(pg_dsn) == {"done": 601}, 90, "every job done")
    for proc in (a, b):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, worker_log(a_counts) + worker_log(b_counts)
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE last_error LIKE 'rescued%%'") == [(0,)]
    every = runs_per_job(a_counts) + runs_per_job(b_counts)
    assert set(every.values()) == {1} and len(every) == 601
    assert sum(runs_per_job(b_counts).values()) >= 400, "A hoarded jobs B could have run"


def test_a_long_shutdown_keeps_heartbeating(pg_dsn: str, tmp_path: Path) -> None:
    """A worker finishing a long job after SIGTERM still beats: the peer that holds the rescuer's
    lock (it started first) never rescues that job, whose outcome then lands as attempt 1."""
    counts = tmp_path / "counts"
    counts.mkdir()
    b = start_worker(pg_dsn, tmp_path / "b", counts, "--worker-id", "host-b", "--queues", "b", *PEER,
                     "--rescue-grace", "0", procs=1)
    wait_for(lambda: query(pg_dsn, "SELECT count(*) FROM shardworker.workers")[0][0] == 1, 30, "B the rescuer")
    [slow] = enqueue(pg_dsn, "sleepy", 1, {"sleep": 14}, queue="a")  # well past B's 5 s rescue window
    a = start_worker(pg_dsn, tmp_path / "a", counts, "--worker-id", "host-a", "--queues", "a",
                     "--shutdown-timeout", "30", procs=1)
    wait_for(lambda: runs(counts).get((slow, 1)) == 1, 30, "the long job running")
    time.sleep(1)
    a.send_signal(signal.SIGTERM)
    assert a.wait(40) == 0, worker_log(counts)
    b.send_signal(signal.SIGTERM)
    assert b.wait(30) == 0, worker_log(counts)
    assert query(pg_dsn, "SELECT status, attempt, last_error FROM shardworker.jobs") == [("done", 1, None)]
    assert runs(counts) == {(slow, 1): 1}


def test_a_worker_stopped_in_an_outage_loses_no_outcome_to_a_rescue(
        private_pg: EmbeddedPostgres, tmp_path: Path) -> None:
    """A stopped during an outage with outcomes in its outbox; after the database returns a peer
    rescues A's jobs, but they wait out the grace period, A's outbox is drained meanwhile, and
    no handler whose outcome A had made durable runs again."""
    dsn, counts, a_outbox = private_pg.dsn, tmp_path / "counts", tmp_path / "a"
    counts.mkdir()
    enqueue(dsn, "slow", 120, {"sleep": 0.01})
    a = start_worker(dsn, a_outbox, counts, *FAST, "--worker-id", "host-a", "--rescue-after", "5", "--shutdown-timeout",
                     "2", procs=1)
    wait_for(lambda: status_counts(dsn).get("done", 0) >= 10, 30, "A working")
    private_pg.stop("immediate")
    wait_for(lambda: len(runs(counts)) == 120, 30, "A finishing what it holds into its outbox")
    a.send_signal(signal.SIGTERM)
    assert a.wait(30) == 0, worker_log(counts)
    acked = acknowledged(a_outbox)
    assert len(acked) >= 50, "expected outcomes waiting in A's outbox"
    private_pg.start()
    b = start_worker(dsn, tmp_path / "b", counts, *FAST, "--worker-id", "host-b", *PEER, "--rescue-grace", "20",
                     procs=1)
    wait_for(lambda: query(dsn, "SELECT count(*) FROM shardworker.jobs WHERE rescued_attempt IS NOT NULL")[0][0] > 0,
             30, "B rescuing A's silent jobs")
    result = CliRunner().invoke(cli, ["outbox", "drain", "--outbox-dir", str(a_outbox), "--dsn", dsn])
    assert result.exit_code == 0, result.output
    wait_for(lambda: status_counts(dsn) == {"done": 120}, 60, "every job done")
    b.send_signal(signal.SIGTERM)
    assert b.wait(30) == 0, worker_log(counts)
    assert_promise(dsn, counts, 120, acked)
    assert set(runs_per_job(counts).values()) == {1}


def test_a_read_only_database_is_waited_out(pg_dsn: str, tmp_path: Path) -> None:
    """During a failover the database is read-only for a while: the worker waits it out like an outage
    and finishes every job once."""
    counts = tmp_path / "counts"
    counts.mkdir()
    enqueue(pg_dsn, "slow", 200, {"sleep": 0.01})
    proc = start_worker(pg_dsn, tmp_path / "outbox", counts, *FAST, "--exit-when-idle", procs=2)
    wait_for(lambda: status_counts(pg_dsn).get("done", 0) >= 20, 30, "a first part done")
    set_read_only(pg_dsn, True)
    time.sleep(3)
    assert proc.poll() is None, "the worker exited on a read-only database:\n" + worker_log(counts)
    set_read_only(pg_dsn, False)
    assert proc.wait(60) == 0, worker_log(counts)
    assert status_counts(pg_dsn) == {"done": 200}
    assert set(runs_per_job(counts).values()) == {1}


def set_read_only(dsn: str, on: bool) -> None:
    """Make new sessions of the database read-only (or not) and end the current ones, as a failover does."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET default_transaction_read_only = off")  # this session must write
        name = conn.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        conn.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = {"on" if on else "off"}')
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE datname = current_database() AND pid <> pg_backend_pid()")


def test_a_fast_outcome_is_durable_while_a_slow_handler_runs(pg_dsn: str, tmp_path: Path) -> None:
    """A fast job's outcome is committed while the next handler (which then times out and gets its
    child killed) still runs: the fast job never runs again."""
    counts = tmp_path / "counts"
    counts.mkdir()
    [fast] = enqueue(pg_dsn, "count", 1)
    [hang] = enqueue(pg_dsn, "hang", 1)
    proc = start_worker(pg_dsn, tmp_path / "outbox", counts, "--exit-when-idle", procs=1)
    assert proc.wait(60) == 0, worker_log(counts)
    assert query(pg_dsn, "SELECT id, status, attempt FROM shardworker.jobs ORDER BY id") == [
        (fast, "done", 1), (hang, "done", 2)]
    assert runs(counts)[(fast, 1)] == 1 and (fast, 2) not in runs(counts)


def test_outbox_drain_heartbeats_for_the_worker_whose_outbox_it_drains(pg_dsn: str, tmp_path: Path) -> None:
    """While a drain waits (here on a locked jobs table), it beats for the outbox's worker, so no
    peer rescues the jobs whose outcomes it is about to apply."""
    import subprocess
    import sys

    from outbox import ShardWriter
    from shardworker.core.model import Outcome
    from shardworker.core.wire import encode_outcome
    from shardworker.store.pg_store import PgStore, StoreConfig

    outbox_dir, counts = tmp_path / "outbox", tmp_path / "counts"
    counts.mkdir()
    enqueue(pg_dsn, "count", 1)
    first = start_worker(pg_dsn, outbox_dir, counts, "--worker-id", "host-a", "--exit-when-idle", procs=1)
    assert first.wait(60) == 0, worker_log(counts)
    enqueue(pg_dsn, "count", 1)
    store = PgStore(StoreConfig(dsn=pg_dsn))
    [job] = store.claim(["count"], None, "host-a", 1)
    store.close()
    with ShardWriter.open(str(outbox_dir), 7) as writer:
        writer.append_bytes(encode_outcome(Outcome.done(job.id, job.attempt, b"1")))
        writer.commit()
    with psycopg.connect(pg_dsn) as holder:
        holder.execute("LOCK TABLE shardworker.jobs IN EXCLUSIVE MODE")
        drain = subprocess.Popen([sys.executable, "-m", "shardworker", "outbox", "drain", "--outbox-dir",
                                  str(outbox_dir), "--dsn", pg_dsn, "--timeout", "60"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        beats = []
        for _ in range(8):
            time.sleep(1)
            beats += query(pg_dsn, "SELECT heartbeat_at FROM shardworker.workers WHERE worker_id = 'host-a'")
        assert drain.poll() is None, drain.stdout.read() if drain.stdout else ""
        holder.rollback()
    output, _ = drain.communicate(timeout=60)
    assert drain.returncode == 0, output
    assert len({b for (b,) in beats}) >= 2, f"no heartbeat while draining: {beats}"
    assert query(pg_dsn, "SELECT status FROM shardworker.jobs WHERE id = %s", job.id) == [("done",)]
