"""A worker's identity across stops and neighbours: jobs it never started are given back
uncharged even when it stops during an outage, and one worker id means one live worker.
Real processes, real PostgreSQL; handlers count their own runs."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

from shardworker.embedded import EmbeddedPostgres
from tests.faults.test_faults import FAST
from tests.helpers import (
    enqueue,
    execute,
    exit_code,
    kill_worker_group,
    query,
    runs,
    runs_per_job,
    start_worker,
    status_counts,
    wait_for,
    worker_log,
)


def test_jobs_never_started_at_a_stop_in_an_outage_are_not_charged(private_pg: EmbeddedPostgres,
                                                                   tmp_path: Path) -> None:
    """A worker stopped during an outage holding prefetched jobs; at its next start every job
    runs exactly once and none is charged an attempt it never ran (max_attempts=1)."""
    dsn, outbox_dir, counts = private_pg.dsn, tmp_path / "outbox", tmp_path / "counts"
    counts.mkdir()
    enqueue(dsn, "slow", 300, {"sleep": 0.05}, max_attempts=1)
    proc = start_worker(dsn, outbox_dir, counts, *FAST, procs=2)
    wait_for(lambda: len(runs(counts)) >= 20, 60, "some jobs running")
    private_pg.stop("immediate")
    proc.send_signal(signal.SIGTERM)
    assert exit_code(proc, 60, counts) == 0
    assert len(runs(counts)) < 250, "the worker ran almost everything: nothing was left unstarted"
    private_pg.start()
    again = start_worker(dsn, outbox_dir, counts, *FAST, "--exit-when-idle", procs=2)
    assert exit_code(again, 120, counts) == 0
    assert status_counts(dsn) == {"done": 300}, worker_log(counts)
    assert query(dsn, "SELECT max(attempt) FROM shardworker.jobs") == [(1,)]
    per_job = runs_per_job(counts)
    assert len(per_job) == 300 and set(per_job.values()) == {1}
    assert "no attempt charged" in worker_log(counts)


def test_a_second_live_worker_with_the_same_worker_id_is_refused(pg_dsn: str, tmp_path: Path) -> None:
    """Two workers on one database with one --worker-id: the second exits 1 with one line naming
    the first's host and pid, and none of the first's jobs runs twice."""
    counts = tmp_path / "counts"
    counts.mkdir()
    enqueue(pg_dsn, "slow", 20, {"sleep": 0.3})
    first = start_worker(pg_dsn, tmp_path / "a", counts, "--worker-id", "shared", procs=2)
    wait_for(lambda: len(runs(counts)) >= 2 and query(
        pg_dsn, "SELECT count(*) FROM shardworker.workers WHERE worker_id = 'shared'") == [(1,)], 30,
        "the first worker running jobs")
    second_log = tmp_path / "second.log"
    second = start_worker(pg_dsn, tmp_path / "b", counts, "--worker-id", "shared", "--exit-when-idle", procs=2,
                          log_path=second_log)
    assert exit_code(second, 60, counts) == 1, second_log.read_text()
    line = second_log.read_text()
    assert f"{socket.gethostname()}" in line and f"pid {first.pid}" in line and "--worker-id" in line, line
    assert "Traceback" not in line
    wait_for(lambda: status_counts(pg_dsn) == {"done": 20}, 60, "the first worker finishing every job")
    first.send_signal(signal.SIGTERM)
    assert exit_code(first, 30, counts) == 0
    assert set(runs_per_job(counts).values()) == {1}, "a job ran twice"


def test_a_worker_killed_then_restarted_with_its_id_starts_at_once(pg_dsn: str, tmp_path: Path) -> None:
    """A worker killed with -9 leaves its heartbeat row behind; the next worker with the same id
    on the same host sees the row's pid is dead and starts without watching it."""
    counts = tmp_path / "counts"
    counts.mkdir()
    enqueue(pg_dsn, "slow", 6, {"sleep": 0.2})
    first = start_worker(pg_dsn, tmp_path / "a", counts, "--worker-id", "same", procs=1)
    wait_for(lambda: len(runs(counts)) >= 1 and query(
        pg_dsn, "SELECT count(*) FROM shardworker.workers WHERE worker_id = 'same'") == [(1,)], 30, "a first run")
    kill_worker_group(first)
    again = start_worker(pg_dsn, tmp_path / "a", counts, "--worker-id", "same", "--exit-when-idle", procs=1)
    assert exit_code(again, 60, counts) == 0
    assert status_counts(pg_dsn) == {"done": 6}
    assert "watching" not in worker_log(counts), worker_log(counts)


def test_a_silent_row_of_another_host_is_watched_then_taken_over(pg_dsn: str, tmp_path: Path) -> None:
    """A heartbeat row of this id from another host that no longer beats (a copied outbox, a host
    gone) is watched for a few heartbeats, then taken over."""
    counts = tmp_path / "counts"
    counts.mkdir()
    execute(pg_dsn, "INSERT INTO shardworker.workers (worker_id, hostname, pid, heartbeat_at) "
                    "VALUES ('moved', 'elsewhere.invalid', %s, now() - interval '1 minute')", os.getpid())
    enqueue(pg_dsn, "count", 3)
    proc = start_worker(pg_dsn, tmp_path / "a", counts, "--worker-id", "moved", "--exit-when-idle", procs=1)
    assert exit_code(proc, 60, counts) == 0
    assert status_counts(pg_dsn) == {"done": 3}
    assert "watching" in worker_log(counts) and "elsewhere.invalid" in worker_log(counts)


def test_outbox_drain_gives_back_the_jobs_a_stop_kept(pg_dsn: str, tmp_path: Path) -> None:
    """`outbox drain` releases, uncharged, the jobs kept in giveback.json (two stops' lists merged);
    a job rescued and claimed again meanwhile is not touched."""
    from click.testing import CliRunner

    from shardworker.cli.main import main as cli
    from shardworker.core import layout
    from shardworker.store.pg_store import PgStore, StoreConfig

    outbox_dir = tmp_path / "outbox"
    outbox_dir.mkdir(mode=0o700)
    enqueue(pg_dsn, "count", 5)
    store = PgStore(StoreConfig(dsn=pg_dsn))
    try:
        first = store.claim(["count"], None, "host-a", 2)
        second = store.claim(["count"], None, "host-a", 1, "token-2")
        rescued = store.claim(["count"], None, "host-a", 1)
    finally:
        store.close()
    layout.save_giveback(str(outbox_dir), "host-a", [(j.id, j.attempt) for j in first], [])
    layout.save_giveback(str(outbox_dir), "host-a", [(rescued[0].id, rescued[0].attempt)], ["token-2"])
    assert layout.count_giveback(str(outbox_dir)) == (3, 1)
    status = CliRunner().invoke(cli, ["outbox", "status", "--outbox-dir", str(outbox_dir)])
    assert "3 unstarted job(s) and 1 lost claim(s) to give back" in status.output, status.output
    execute(pg_dsn, "UPDATE shardworker.jobs SET locked_by = 'host-b', attempt = 2 WHERE id = %s", rescued[0].id)
    result = CliRunner().invoke(cli, ["outbox", "drain", "--outbox-dir", str(outbox_dir), "--dsn", pg_dsn,
                                      "--timeout", "10"])
    assert result.exit_code == 0, result.output
    given_back = [j.id for j in [*first, *second]]
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE id = ANY(%s) AND status = 'queued' "
                         "AND attempt = 0 AND locked_by IS NULL", given_back) == [(3,)]
    assert query(pg_dsn, "SELECT status, attempt, locked_by FROM shardworker.jobs WHERE id = %s",
                 rescued[0].id) == [("running", 2, "host-b")]
    assert not (outbox_dir / layout.GIVEBACK_FILE).exists()


def test_a_running_worker_whose_row_another_process_rewrites_stops(pg_dsn: str, tmp_path: Path) -> None:
    """The race at start: another process rewrites the heartbeat row of a running worker's id. The
    worker stops with one line naming that process, leaves its row alone, gives back what it never
    started, and no job runs twice."""
    counts = tmp_path / "counts"
    counts.mkdir()
    enqueue(pg_dsn, "slow", 30, {"sleep": 0.3})
    proc = start_worker(pg_dsn, tmp_path / "a", counts, "--worker-id", "raced", procs=1)
    wait_for(lambda: len(runs(counts)) >= 1 and query(
        pg_dsn, "SELECT count(*) FROM shardworker.workers WHERE worker_id = 'raced'") == [(1,)], 30, "running")
    execute(pg_dsn, "UPDATE shardworker.workers SET hostname = 'other.invalid', pid = 4242, heartbeat_at = now() "
                    "WHERE worker_id = 'raced'")
    assert exit_code(proc, 60, counts) == 1
    assert "worker id 'raced' is in use by a live worker on other.invalid (pid 4242)" in worker_log(counts)
    assert query(pg_dsn, "SELECT hostname, pid FROM shardworker.workers") == [("other.invalid", 4242)]
    ran = runs_per_job(counts)
    assert set(ran.values()) == {1}
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE status = 'running'") == [(0,)]
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE status = 'queued' AND attempt = 0")[0][0] \
        == 30 - len(ran)


def test_outbox_drain_is_refused_while_a_live_worker_uses_its_worker_id(pg_dsn: str, tmp_path: Path) -> None:
    """A drain of an outbox whose worker id a live worker elsewhere uses exits 1 with the line."""
    from click.testing import CliRunner

    from shardworker.cli.main import main as cli

    counts, copied = tmp_path / "counts", tmp_path / "copied"
    counts.mkdir()
    proc = start_worker(pg_dsn, tmp_path / "a", counts, "--worker-id", "busy", procs=1)
    wait_for(lambda: query(pg_dsn, "SELECT count(*) FROM shardworker.workers WHERE worker_id = 'busy'") == [(1,)],
             30, "the worker beating")
    copied.mkdir(mode=0o700)
    (copied / "worker-id").write_text("busy")
    result = CliRunner().invoke(cli, ["outbox", "drain", "--outbox-dir", str(copied), "--dsn", pg_dsn,
                                      "--timeout", "30"])
    assert result.exit_code == 1, result.output
    assert f"pid {proc.pid}" in result.output and "--worker-id" in result.output, result.output
