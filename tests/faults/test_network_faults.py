"""Network faults between the worker and PostgreSQL (durability.md, fault table row 10).

Each test runs a real worker whose ``--dsn`` goes through ``tests.proxy.PgProxy`` while the test's
own checks use the server directly. Faults: refused connects, resets (of everything, repeatedly; of the
flush statement before it reaches the server; after the server committed it, the "maybe applied" case
that must replay harmlessly; after N bytes, mid-message; of a claim the server committed; of the release
of unstarted jobs at shutdown), a black hole longer than the network timeout (also with a SIGTERM in it),
and latency. After every fault: all jobs done with their results, each handler ran once (no kills here,
so no re-run is excusable), nothing stays running, and the worker rode the fault out and exits 0.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from outbox import status as outbox_status
from shardworker.embedded import EmbeddedPostgres
from tests import proxy as proxy_module
from tests.faults.network_scenario import (
    BLACKHOLE_S,
    CLAIM,
    FLUSH,
    SHUTDOWN_BOUND_S,
    SLOW,
    Scenario,
)
from tests.helpers import (
    query,
    runs_per_job,
    status_counts,
    wait_for,
    worker_log,
)
from tests.proxy import PgProxy

pg_proxy = proxy_module.pg_proxy  # the fixture: a proxy in front of ``private_pg``

@pytest.fixture
def scenario(private_pg: EmbeddedPostgres, pg_proxy: PgProxy, tmp_path: Path) -> Iterator[Scenario]:
    sc = Scenario(private_pg, pg_proxy, tmp_path)
    try:
        yield sc
    finally:
        sc.kill()


def test_refused_connections(scenario: Scenario) -> None:
    """Every connection reset and new connects refused for 3 s: the worker keeps running jobs it holds,
    claims nothing new, and catches up by itself once connects succeed again."""
    sc = scenario
    sc.enqueue("slow", 200, SLOW)
    sc.start()
    wait_for(lambda: sc.done() >= 20, 30, "a first part done")
    sc.proxy.refuse(reset_existing=True)
    sc.enqueue("slow", 150, SLOW)  # due during the outage: must wait for it to end
    time.sleep(1.0)
    done_at_1s = sc.done()
    time.sleep(2.0)
    sc.assert_alive("refused connections")
    assert sc.done() == done_at_1s, "outcomes applied through a refusing proxy?"
    assert status_counts(sc.dsn).get("queued") == 150, "jobs claimed through a refusing proxy?"
    sc.proxy.set_pass()
    sc.wait_all_done(30)
    sc.stop()
    sc.assert_each_job_done_once()
    log = worker_log(sc.count_dir)
    # One line when the database was lost, one when it came back: not one per retry.
    assert log.count("database unreachable") == 1 and log.count("database back after") == 1, log


def test_database_back_during_stop(scenario: Scenario) -> None:
    """Connects refused until the moment of a SIGTERM: every outcome waited in the outbox, the stop
    applies them as the database returns, and the log says it came back (the parent's next pass,
    which would have said so, never comes once a stop has begun)."""
    sc = scenario
    sc.enqueue("slow", 200, SLOW)
    sc.start()
    wait_for(lambda: sc.done() >= 20, 30, "a first part done")
    sc.proxy.refuse(reset_existing=True)
    wait_for(lambda: len(runs_per_job(sc.count_dir)) == 200, 30, "every held job run during the outage")
    assert sc.done() < 200, "every outcome applied through a refusing proxy?"
    sc.proxy.set_pass()
    sc.stop()
    sc.assert_each_job_done_once()
    log = worker_log(sc.count_dir)
    assert log.count("database unreachable") == 1 and log.count("database back after") == 1, log


def test_connections_reset_repeatedly(scenario: Scenario) -> None:
    """Every connection reset every 0.2 s for 4 s while jobs keep arriving: no stall, no duplicate."""
    sc = scenario
    sc.enqueue("slow", 200, SLOW)
    sc.start()
    wait_for(lambda: sc.done() >= 20, 30, "a first part done")
    resets, started = 0, time.monotonic()
    for wave in range(4):
        sc.enqueue("slow", 75, SLOW)
        while time.monotonic() < started + wave + 1:
            resets += sc.proxy.reset_all()
            time.sleep(0.2)
    sc.assert_alive("repeated resets")
    assert resets >= 10, f"only {resets} connections were reset"
    sc.wait_all_done(30)
    sc.stop()
    sc.assert_each_job_done_once()
    # Each reset is the parent's to tell (once per outage), not psycopg's as a cut batch's pipeline closes.
    log = worker_log(sc.count_dir)
    assert "error ignored" not in log, log


def test_reset_before_flush_reaches_server(scenario: Scenario) -> None:
    """The flush UPDATE is cut before its Execute reaches the server, several times in a row: the
    flusher retries the same batch, which then applies."""
    sc, times = scenario, 3
    sc.enqueue("count", 300, {"n": 1})
    sc.proxy.cut_on_query(*FLUSH, when="before", times=times)
    sc.start("--exit-when-idle")
    cuts = sc.proxy.wait_events("cut", times, 30)
    assert all("before execute of: -- Apply a batch of outcomes" in c.detail for c in cuts), cuts
    sc.assert_alive("flush resets")
    sc.wait_idle_exit(30)
    sc.assert_each_job_done_once()
    # Three failed flushes in a row are one outage to the log, not three lines: the parent
    # says when the database was lost and when it was back (unless both fell between two looks).
    log = worker_log(sc.count_dir)
    assert log.count("database unreachable") <= 1 and "flush" not in log.lower(), log
    assert log.count("database back after") == log.count("database unreachable"), log


def test_reset_after_flush_committed_replays_harmlessly(scenario: Scenario) -> None:
    """The server commits the flush UPDATE but the reply is lost ("maybe applied"), three times: the
    flusher replays the batches, the fenced update changes nothing, nothing runs again."""
    sc = scenario
    sc.enqueue("slow", 300, SLOW)
    sc.proxy.cut_on_query(*FLUSH, when="commit", times=3)
    sc.start("--exit-when-idle")
    cuts = sc.proxy.wait_events("cut", 3, 30)
    assert all("of: -- Apply a batch of outcomes" in c.detail and "committed=True" in c.detail for c in cuts), cuts
    sc.assert_alive("lost flush replies")
    sc.wait_idle_exit(30)
    sc.assert_each_job_done_once()


def test_connections_cut_after_n_bytes(scenario: Scenario) -> None:
    """Connections cut mid-message after 3000 bytes (the flush's Bind arrays, claims, heartbeats)."""
    sc = scenario
    sc.enqueue("count", 400, {"pad": "x" * 50})
    sc.proxy.cut_after(3000, times=6)
    sc.start("--exit-when-idle")
    sc.proxy.wait_events("cut", 6, 30)
    sc.assert_alive("connection cuts")
    sc.wait_idle_exit(30)
    sc.assert_each_job_done_once()


def test_blackhole_longer_than_network_timeout(scenario: Scenario) -> None:
    """A black hole (bytes swallowed both ways, nothing answered) for longer than the network timeout plus the
    statement timeout: the worker notices through its own deadline (keepalives can't help through a proxy),
    stays up, keeps trying new connections, and recovers once the network passes again."""
    sc = scenario
    sc.enqueue("slow", 200, SLOW)
    sc.start()
    wait_for(lambda: sc.done() >= 20, 30, "a first part done")
    log_size = len(worker_log(sc.count_dir))
    sc.proxy.blackhole()
    sc.enqueue("slow", 150, SLOW)
    blackhole_at = time.monotonic()
    time.sleep(BLACKHOLE_S)
    sc.assert_alive("the black hole")
    retried = [e for e in sc.proxy.events("accept") if e.at > blackhole_at and e.detail == "blackhole"]
    assert status_counts(sc.dsn).get("queued") == 150, "jobs claimed through a black hole?"
    noticed = "failed" in worker_log(sc.count_dir)[log_size:]
    sc.proxy.set_pass()
    sc.wait_all_done(20)
    assert noticed, "the worker logged no database failure during the black hole" + sc.context()
    assert retried, "the worker tried no new connection during the black hole" + sc.context()
    sc.stop()
    sc.assert_each_job_done_once()


def test_latency(scenario: Scenario) -> None:
    """50 ms each way on every chunk: slower, nothing else changes."""
    sc = scenario
    sc.proxy.latency(50)
    started = time.monotonic()
    assert query(sc.proxy.dsn, "SELECT 1") == [(1,)]
    assert time.monotonic() - started >= 0.2, "the proxy added no latency"
    sc.enqueue("count", 300, {"n": 2})
    sc.start("--exit-when-idle")
    sc.wait_idle_exit(60)
    sc.assert_each_job_done_once()


def test_claim_reply_lost(scenario: Scenario) -> None:
    """The server commits a claim but the reply is lost: those jobs are running for this worker, which
    never received them. They must not stay running: they are given back, claimed again and run once."""
    sc = scenario
    sc.enqueue("count", 100, {"n": 3})
    sc.proxy.cut_on_query(*CLAIM, when="after", times=1)
    sc.start("--exit-when-idle")
    [cut] = sc.proxy.wait_events("cut", 1, 30)
    assert "committed=True" in cut.detail, cut
    sc.assert_alive("a lost claim reply")
    sc.wait_idle_exit(20)
    sc.assert_each_job_done_once()
    assert "gave back 100 jobs of a claim whose reply was lost" in worker_log(sc.count_dir), \
        f"the cut: {cut.detail}" + sc.context()


class OrphanedRunningJobs(AssertionError):
    """Jobs left running for a worker that exited and removed its heartbeat: nothing will ever requeue them."""


def assert_nothing_orphaned(dsn: str) -> None:
    running = dict(query(dsn, "SELECT locked_by, count(*) FROM shardworker.jobs WHERE status = 'running' "
                              "GROUP BY locked_by"))
    beating = {r[0] for r in query(dsn, "SELECT worker_id FROM shardworker.workers")}
    orphaned = {worker: n for worker, n in running.items() if worker not in beating}
    if orphaned:
        raise OrphanedRunningJobs(f"jobs running for workers without a heartbeat row: {orphaned}")


RELEASE = (b"Give back claimed jobs whose handler never started",)  # job_release, at shutdown
ORPHANED_AT_SHUTDOWN = (
    "product bug: when giving back unstarted jobs fails at shutdown, Supervisor._shutdown still deletes the "
    "worker's heartbeat row (forget_worker), so the jobs stay running with no rescuer ever requeueing them "
    "unless this same worker id restarts")


def test_reset_of_release_at_shutdown(scenario: Scenario) -> None:
    """SIGTERM while children hold prefetched jobs they never started; the statement giving them back is
    reset. The worker exits 0 and leaves nothing running that no one will requeue; a restart on the same
    outbox finishes every job, each handler run once."""
    sc = scenario
    sc.enqueue("slow", 1200, SLOW)
    sc.start("--shutdown-timeout", "5")
    wait_for(lambda: sc.done() >= 20, 30, "a first part done")
    sc.proxy.cut_on_query(*RELEASE, when="before", times=1)
    sc.stop()
    [cut] = sc.proxy.wait_events("cut", 1, 1)
    assert "before execute" in cut.detail, cut
    orphaned: OrphanedRunningJobs | None = None
    try:
        assert_nothing_orphaned(sc.dsn)
    except OrphanedRunningJobs as exc:
        orphaned = exc
    sc.start("--exit-when-idle")
    sc.wait_idle_exit(30)
    sc.assert_each_job_done_once(max_attempt=2)  # requeued at the restart: that attempt never ran
    if orphaned is not None:
        raise orphaned


def test_sigterm_during_blackhole_then_restart(scenario: Scenario) -> None:
    """SIGTERM while the network is a black hole: the worker still exits 0 in bounded time, keeping its
    outcomes in the outbox; restarted once the network passes, it applies them and runs nothing again."""
    sc = scenario
    sc.enqueue("slow", 300, SLOW)
    proc = sc.start("--shutdown-timeout", "2")
    wait_for(lambda: sc.done() >= 20, 30, "a first part done")
    sc.proxy.blackhole()
    time.sleep(1.0)
    sc.assert_alive("the black hole")
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(SHUTDOWN_BOUND_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"no exit {SHUTDOWN_BOUND_S}s after SIGTERM in a black hole" + sc.context()) from None
    assert code == 0, f"exit code {code}" + sc.context()
    assert outbox_status(str(sc.outbox_dir)).pending > 0, "expected outcomes left in the outbox"
    sc.proxy.set_pass()
    sc.start("--exit-when-idle")
    sc.wait_idle_exit(30)
    sc.assert_each_job_done_once(max_attempt=2)  # unstarted jobs are requeued at the restart, never run
