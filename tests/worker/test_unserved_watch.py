"""The worker's watch for queued kinds no live worker serves, on a real PostgreSQL with a
clock of its own: a pair is said when it appears (not only at start), once while it stays,
again when it comes back; its own kinds are never named; a database that is away is skipped
quietly."""

from __future__ import annotations

import logging

import pytest

from shardworker.core.views import Serving
from shardworker.store.pg_store import PgStore, StoreConfig
from shardworker.worker.unserved import UnservedWatch
from tests.helpers import enqueue, execute

WHAT = "queued jobs that no live worker handles"


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    lines = [r.getMessage() for r in caplog.records if WHAT in r.getMessage()]
    caplog.clear()
    return lines


def test_a_new_unserved_kind_is_said_once_when_it_appears(pg_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "shardworker.worker.unserved")
    now = [0.0]
    watch = UnservedWatch(lambda: PgStore(StoreConfig(dsn=pg_dsn)), ["mine"], None, interval_s=30.0,
                          clock=lambda: now[0])
    enqueue(pg_dsn, "mine", 2)
    watch.run_once()
    assert said(caplog) == []
    enqueue(pg_dsn, "emial", 1)
    now[0] = 10.0
    watch.run_once()  # not checked before the interval passed
    assert said(caplog) == []
    now[0] = 30.0
    watch.run_once()
    [line] = said(caplog)
    assert "emial (queue default): 1 queued, the oldest due" in line and "mine" not in line
    for t in (60.0, 90.0):  # still there: not said again
        now[0] = t
        watch.run_once()
    assert said(caplog) == []
    enqueue(pg_dsn, "other", 1, queue="mail")
    now[0] = 120.0
    watch.run_once()
    [line] = said(caplog)  # only the new one
    assert "other (queue mail)" in line and "emial" not in line


def test_a_kind_that_gets_a_worker_and_loses_it_is_said_again(pg_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "shardworker.worker.unserved")
    now = [0.0]
    watch = UnservedWatch(lambda: PgStore(StoreConfig(dsn=pg_dsn)), [], None, interval_s=1.0, clock=lambda: now[0])
    enqueue(pg_dsn, "k", 1)
    watch.run_once()
    assert len(said(caplog)) == 1
    peer = PgStore(StoreConfig(dsn=pg_dsn))
    try:
        peer.heartbeat("peer", "host", 1, serves=Serving(("k",), None, 60.0))
        now[0] = 1.0
        watch.run_once()
        assert said(caplog) == []
        execute(pg_dsn, "UPDATE shardworker.workers SET heartbeat_at = now() - interval '61 seconds'")
        now[0] = 2.0
        watch.run_once()
        assert len(said(caplog)) == 1
        watch.tell_all()  # what an idle exit says: everything unserved now
        assert len(said(caplog)) == 1
    finally:
        peer.close()


def test_a_database_that_is_away_is_skipped_quietly(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    watch = UnservedWatch(lambda: PgStore(StoreConfig(dsn="postgresql://127.0.0.1:1/none", connect_timeout_s=1)),
                          [], None)
    watch.run_once()
    watch.tell_all()
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
