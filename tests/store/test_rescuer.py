"""The rescuer on real PostgreSQL: a worker watched silent for its window has its running jobs
requeued, once, whoever else watches; the watch starts again after a lost session or a pause
of this host, and is dated when the rescuer saw the beat."""

from __future__ import annotations

import concurrent.futures
import logging
import time

import pytest

from shardworker.core.views import Serving
from shardworker.embedded import EmbeddedPostgres
from shardworker.errors import DatabaseUnavailable
from shardworker.store.pg_store import PgStore, StoreConfig
from shardworker.worker.rescuer import Rescuer
from tests.helpers import query, wait_for
from tests.store.support import add_id, connect, row

# --- rescuer ---------------------------------------------------------------------------------


def beat(store: PgStore, worker: str) -> None:
    store.heartbeat(worker, "host", 1)


def test_rescuer_requeues_jobs_of_a_worker_watched_silent(store: PgStore, other: PgStore, pg_dsn: str) -> None:
    """A worker whose heartbeat stays unchanged for rescue_after while watched gets its running jobs requeued."""
    dead_job, alive_job, own_job = add_id(store, "d"), add_id(store, "a"), add_id(store, "m")
    other.claim(["d"], None, "w-dead", 10)
    other.claim(["a"], None, "w-alive", 10)
    other.claim(["m"], None, "w-me", 10)
    for worker in ("w-dead", "w-alive", "w-me"):
        beat(other, worker)
    rescuer = Rescuer(store, "w-me", rescue_after_s=10.0)
    for now in (0.0, 5.0, 9.9):
        beat(other, "w-alive")
        assert rescuer.run_once(now) == []
    beat(other, "w-alive")
    assert rescuer.run_once(10.1) == [dead_job]
    r = row(pg_dsn, dead_job)
    assert (r["status"], r["locked_by"]) == ("queued", None)
    assert "w-dead" in r["last_error"]
    assert set(store.heartbeats()) == {"w-alive", "w-me"}
    assert row(pg_dsn, alive_job)["status"] == row(pg_dsn, own_job)["status"] == "running"
    for now in (50.0, 100.0):
        beat(other, "w-alive")
        assert rescuer.run_once(now) == []  # its own unchanged heartbeat never rescues itself
    assert row(pg_dsn, own_job)["status"] == "running"


def test_rescuer_forgets_observations_after_connection_lost(store: PgStore, other: PgStore, pg_dsn: str) -> None:
    """After connection_lost nobody is rescued until rescue_after of fresh observation has passed."""
    job_id = add_id(store)
    other.claim(["k"], None, "w-dead", 10)
    beat(other, "w-dead")
    rescuer = Rescuer(store, "w-me", rescue_after_s=10.0)
    assert rescuer.run_once(0.0) == []
    assert rescuer.run_once(9.0) == []
    rescuer.connection_lost()
    assert rescuer.run_once(12.0) == []  # 12 s after first sight, but only 0 s since the outage
    assert rescuer.run_once(21.9) == []
    assert row(pg_dsn, job_id)["status"] == "running"
    assert rescuer.run_once(22.1) == [job_id]


def test_rescuer_restarts_the_clock_when_a_heartbeat_changes(store: PgStore, other: PgStore) -> None:
    """A worker that beats again before rescue_after is watched afresh, not rescued."""
    add_id(store)
    other.claim(["k"], None, "w-slow", 10)
    beat(other, "w-slow")
    rescuer = Rescuer(store, "w-me", rescue_after_s=10.0)
    assert rescuer.run_once(0.0) == []
    beat(other, "w-slow")
    assert rescuer.run_once(9.0) == []
    assert rescuer.run_once(18.0) == []
    assert rescuer.run_once(19.1) != []


def test_two_rescuers_watching_one_silent_worker_rescue_it_once(
        store: PgStore, other: PgStore, pg_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """No lock picks a rescuer (a frozen holder would keep it for good): two workers watch the
    same silent one. The first to act requeues its job (one failed attempt) and says so; the
    second finds its row gone, requeues nothing and says nothing."""
    job_id = add_id(store)
    store.claim(["k"], None, "w-dead", 10)
    beat(store, "w-dead")
    first, second = Rescuer(store, "w-1", 10.0), Rescuer(other, "w-2", 10.0)
    beat(store, "w-1")
    beat(other, "w-2")  # each rescuer runs after its own worker's beat, on the same session
    assert first.run_once(0.0) == [] and second.run_once(0.0) == []
    beat(store, "w-1")
    beat(other, "w-2")
    with caplog.at_level(logging.WARNING):
        assert second.run_once(10.1) == [job_id]
        assert first.run_once(10.1) == []
    assert [r.getMessage() for r in caplog.records if "rescued" in r.getMessage()] == [
        "rescued 1 jobs of silent workers w-dead (claimable again in 0s)"]
    r = row(pg_dsn, job_id)
    assert (r["status"], r["attempt"], r["rescued_attempt"], len(r["errors"])) == ("queued", 1, 1, 1)


def test_concurrent_rescues_of_one_worker_requeue_its_jobs_once(store: PgStore, other: PgStore, pg_dsn: str) -> None:
    """The same rescue from two sessions at once: both wait on the silent worker's row (locked
    here meanwhile), then one deletes it and the other, its DELETE rechecking the row, finds it
    gone; the jobs are requeued once."""
    job_id = add_id(store)
    store.claim(["k"], None, "w-dead", 10)
    beat(store, "w-dead")
    observed = [("w-dead", store.heartbeats()["w-dead"])]
    with connect(pg_dsn) as holder, concurrent.futures.ThreadPoolExecutor(2) as pool:
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM shardworker.workers WHERE worker_id = 'w-dead' FOR UPDATE")
        futures = [pool.submit(s.rescue_workers, observed) for s in (store, other)]
        wait_for(lambda: waiting_on_locks(pg_dsn) == 2, 10, "both rescues waiting on the row")
        holder.execute("COMMIT")
        results = [f.result(10) for f in futures]
    assert sorted(results) == [((), []), (("w-dead",), [job_id])]
    assert row(pg_dsn, job_id)["errors"][-1]["attempt"] == 1 and len(row(pg_dsn, job_id)["errors"]) == 1


def test_a_worker_is_rescued_only_after_its_own_rescue_window_too(store: PgStore, other: PgStore, pg_dsn: str) -> None:
    """Without a lock every worker rescues: a peer started with a short --rescue-after (say, one
    debugging against production) must not rescue a worker whose own window is longer. The
    longer of the two windows counts (the silent worker's is in its row)."""
    job_id = add_id(store)
    other.claim(["k"], None, "w-prod", 10)
    other.heartbeat("w-prod", "host", 1, serves=Serving(("k",), None, 3600.0))
    beat(store, "w-debug")
    rescuer = Rescuer(store, "w-debug", rescue_after_s=10.0)
    assert rescuer.run_once(0.0) == []
    assert rescuer.run_once(11.0) == []  # its own window passed, not w-prod's
    assert rescuer.run_once(3599.0) == []
    assert row(pg_dsn, job_id)["status"] == "running"
    assert rescuer.run_once(3600.1) == [job_id]


def test_a_rescuer_paused_longer_than_its_heartbeats_watches_afresh(store: PgStore, other: PgStore,
                                                                     pg_dsn: str) -> None:
    """A host paused (SIGSTOP, a VM suspended) keeps its sessions; on resume its rescuer must not
    count the pause as watched silence: peers paused with it, or cut off from it, have not had
    their chance to beat. A gap between two looks longer than max_gap_s starts the watch again."""
    job_id = add_id(store)
    other.claim(["k"], None, "w-peer", 10)
    beat(other, "w-peer")
    beat(store, "w-me")
    rescuer = Rescuer(store, "w-me", rescue_after_s=60.0, max_gap_s=6.0)
    assert rescuer.run_once(0.0) == []
    assert rescuer.run_once(120.0) == []  # paused for 120 s: not 120 s of watching
    assert row(pg_dsn, job_id)["status"] == "running"
    for now in range(122, 180, 2):
        assert rescuer.run_once(float(now)) == []
    assert rescuer.run_once(180.1) == [job_id]


class SlowFirstWatch:
    """A rescuer's store whose first look at the heartbeats takes half a second (a slow query
    under load), as a rescuer would see it."""

    def __init__(self, store: PgStore) -> None:
        self.store, self.slow = store, True

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def rescue_watch(self) -> object:
        if self.slow:
            self.slow = False
            time.sleep(0.5)
        return self.store.rescue_watch()


def test_a_slow_look_dates_a_first_sight_when_its_answer_came(store: PgStore, other: PgStore, pg_dsn: str) -> None:
    """The silence a rescue needs is counted from when the rescuer saw the beat, not from when
    its look began: a look slowed by half a second must not let the rescue come half a second
    early, before the silent worker's own gate has closed (from a review)."""
    job_id = add_id(store)
    other.claim(["k"], None, "w-cut-off", 10)
    beat(other, "w-cut-off")
    beat(store, "w-me")
    rescuer = Rescuer(SlowFirstWatch(store), "w-me", rescue_after_s=10.0)  # type: ignore[arg-type]
    assert rescuer.run_once(0.0) == []
    assert rescuer.run_once(10.2) == []  # 10.2 s after the look began, 9.7 after the beat was seen
    assert row(pg_dsn, job_id)["status"] == "running"
    assert rescuer.run_once(10.6) == [job_id]


def test_rescuer_rescues_nobody_right_after_its_store_reconnected(private_pg: EmbeddedPostgres) -> None:
    """When the rescuer's store lost its session (server restart), earlier observations prove nothing."""
    store = PgStore(StoreConfig(dsn=private_pg.dsn, connect_timeout_s=2))
    try:
        add_id(store)
        store.claim(["k"], None, "w-dead", 10)
        beat(store, "w-dead")
        rescuer = Rescuer(store, "w-me", rescue_after_s=10.0)
        assert rescuer.run_once(0.0) == []
        private_pg.stop("immediate")  # a full outage: nobody can beat
        with pytest.raises(DatabaseUnavailable):
            store.claim(["k"], None, "w-me", 10)  # the dispatcher's claim notices it first
        private_pg.start()
        store.claim(["k"], None, "w-me", 10)  # and reconnects the shared store
        assert rescuer.run_once(60.0) == []
    finally:
        store.close()


def waiting_on_locks(dsn: str) -> int:
    return int(query(dsn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                          "AND wait_event_type = 'Lock'")[0][0])


def test_a_worker_watched_silent_past_its_slots_window_is_released_long_before_its_rescue(
        store: PgStore, other: PgStore, pg_dsn: str) -> None:
    """--release-slots-after: a worker watched silent for the longer of this worker's window and
    its own is in ``released`` (its jobs untouched), one beating is not, one whose row names no
    window (an older release) never is; a lost session forgets the watch, released included."""
    job_id = add_id(store)
    other.claim(["k"], None, "w-dead", 10)
    other.heartbeat("w-dead", "host", 1, serves=Serving(("k",), None, 3600.0, 15.0))
    other.heartbeat("w-old", "host", 2, serves=Serving(("k",), None, 3600.0))
    rescuer = Rescuer(store, "w-me", rescue_after_s=3600.0, release_after_s=10.0)
    assert rescuer.run_once(0.0) == [] and rescuer.released == ()
    other.heartbeat("w-live", "host", 3, serves=Serving(("k",), None, 3600.0, 10.0))
    assert rescuer.run_once(14.0) == [] and rescuer.released == ()  # its own 15 s is the longer
    other.heartbeat("w-live", "host", 3, serves=Serving(("k",), None, 3600.0, 10.0))
    assert rescuer.run_once(15.1) == [] and rescuer.released == ("w-dead",)
    assert row(pg_dsn, job_id)["status"] == "running"
    rescuer.connection_lost()
    assert rescuer.released == ()
    assert rescuer.run_once(16.0) == [] and rescuer.released == ()
