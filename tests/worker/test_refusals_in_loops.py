"""The parent's database loops (heartbeat, rescuer, housekeeping) driven in-process with
``run_once`` on a real PostgreSQL behind ``FlakyStore``: a refusal the database will
repeat (``DataRejected``) is told at ERROR with what it is and is not retried as an
outage; an unreachable database still is."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from shardworker.core.retry import Backoff
from shardworker.core.views import Rescued
from shardworker.errors import DatabaseUnavailable, DataRejected
from shardworker.store.pg_store import PgStore, StoreConfig
from shardworker.worker.heartbeat import Heartbeat
from shardworker.worker.housekeeping import Housekeeper
from shardworker.worker.rescuer import Rescuer
from tests.flaky_store import FlakyStore
from tests.helpers import enqueue, query

REFUSAL = "database refused: index row size 3056 exceeds btree version 4 maximum 2704"


@pytest.fixture
def store(pg_dsn: str) -> Iterator[FlakyStore]:
    s = PgStore(StoreConfig(dsn=pg_dsn, connect_timeout_s=3, statement_timeout_s=5))
    yield FlakyStore(s)
    s.close()


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_refused_rescue_is_told_at_error_and_set_aside(store: FlakyStore, caplog: pytest.LogCaptureFixture) -> None:
    store.heartbeat("gone-worker", socket.gethostname(), os.getpid())
    rescuer = Rescuer(store, "me", rescue_after_s=1.0)
    store.fail("rescue_workers", times=100, make=lambda: DataRejected(REFUSAL))
    with caplog.at_level(logging.DEBUG):
        assert rescuer.run_once(0.0) == []
        assert rescuer.run_once(2.0) == []  # silent long enough: the rescue is refused
        assert rescuer.run_once(4.0) == [] and rescuer.run_once(6.0) == []
    assert store.calls["rescue_workers"] == 1, "a refused rescue must not be retried forever"
    [line] = errors(caplog)
    assert "gone-worker" in line and "exceeds btree" in line
    assert "unavailable" not in caplog.text


def test_one_workers_refused_rescue_holds_back_no_other(pg_dsn: str, store: FlakyStore,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """Two workers go silent; the database refuses the rescue of one: the other's job is rescued."""
    enqueue(pg_dsn, "k", 1)
    [job] = store.claim(["k"], None, "gone-good", 1)
    for worker in ("gone-good", "gone-bad"):
        store.heartbeat(worker, socket.gethostname(), os.getpid())
    real = store.store.rescue_workers

    def refuse_bad(observed: list[Any], grace_s: float = 0.0) -> Rescued:
        if any(w == "gone-bad" for w, _ in observed):
            raise DataRejected(REFUSAL)
        return real(observed, grace_s)

    store.store.rescue_workers = refuse_bad
    rescuer = Rescuer(store, "me", rescue_after_s=1.0)
    with caplog.at_level(logging.DEBUG):
        rescuer.run_once(0.0)
        assert rescuer.run_once(2.0) == [job.id]
    assert query(pg_dsn, "SELECT status FROM shardworker.jobs WHERE id = %s", job.id) == [("queued",)]
    [line] = errors(caplog)
    assert "gone-bad" in line and "gone-good" not in line


def test_a_refused_heartbeat_is_told_at_error_without_outage_backoff(
        store: FlakyStore, caplog: pytest.LogCaptureFixture) -> None:
    beat = Heartbeat(store, "me", interval_s=1.0, rescue_after_s=None, backoff=Backoff(0.05, 60.0))
    store.fail("beat", times=20, make=lambda: DataRejected(REFUSAL))
    with caplog.at_level(logging.DEBUG):
        delays = [beat.run_once(float(t)) for t in range(12)]
    assert delays == [1.0] * 12, "a refusal is not an outage: no growing backoff"
    [line] = errors(caplog)
    assert "exceeds btree" in line


def test_refused_housekeeping_is_told_at_error_and_waits_a_round(
        store: FlakyStore, caplog: pytest.LogCaptureFixture) -> None:
    clock: list[float] = [100.0]

    def now() -> Any:
        return clock[0]

    keeper = Housekeeper(store, [], retention_s=60.0, backoff=Backoff(0.05, 5.0), prune_interval_s=30.0, clock=now)
    clock[0] += 10  # past the startup pause
    store.fail("prune_batch", times=5, make=lambda: DataRejected(REFUSAL))
    with caplog.at_level(logging.DEBUG):
        assert keeper.run_once() == 30.0
    [line] = errors(caplog)
    assert "exceeds btree" in line and "housekeeping" in line


def test_a_failing_heartbeat_tries_again_before_the_childrens_gate_would_close(store: FlakyStore) -> None:
    """During an outage the heartbeat backs off, but never past the moment the children's gate
    would close (an interval before): an outage shorter than --rescue-after must not stall a
    healthy worker's starts (a review saw 0.67 s with --rescue-after 5 and a 3.5 s outage)."""
    beat = Heartbeat(store, "me", interval_s=1.0, rescue_after_s=5.0, backoff=Backoff(2.0, 60.0))
    assert beat.run_once(0.0) == 1.0
    store.fail("beat", times=10, make=lambda: DatabaseUnavailable("connection refused"))
    delays = [beat.run_once(float(t)) for t in range(1, 8)]
    assert all(delay <= 4.0 for delay in delays), delays


def test_a_stalled_heartbeat_does_not_restart_the_rescuers_watch_unless_the_pause_could_matter(
        store: FlakyStore) -> None:
    """The rescuer watches afresh after a gap only when the gap is long enough for a peer paused
    with this host to miss its window: a few seconds' stall under load (a slow fsync) must not
    restart every watch of an hour-long window (a clean-clone run's rescue stalled once)."""
    hour = Heartbeat(store, "me", interval_s=2.0, rescue_after_s=3600.0, backoff=Backoff(0.05, 1.0))
    short = Heartbeat(store, "me", interval_s=2.0, rescue_after_s=5.0, backoff=Backoff(0.05, 1.0))
    assert hour.rescuer is not None and hour.rescuer.max_gap_s == 3596.0
    assert short.rescuer is not None and short.rescuer.max_gap_s == 6.0
