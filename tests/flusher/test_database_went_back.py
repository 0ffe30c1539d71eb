"""The flusher finds the database went back in time, and applies its kept tail again.

The database's going back is a real one: a copy of the database taken midway (``CREATE
DATABASE ... TEMPLATE``, a snapshot as a backup or a lagging replica holds one) replaces it
under the same name. Claims made after the copy are lost with it, as at a failover. The
failover itself, with a streaming replica, is tests/faults/test_database_regression.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from outbox import Keep, OutboxReader, ShardWriter
from shardworker.core import layout, wire
from shardworker.core.model import ClaimedJob, Outcome
from shardworker.flusher.loop import Flusher
from shardworker.flusher.marks import REAPPLIED_GRACE_S
from shardworker.flusher.process import marks_for
from shardworker.store.pg_store import PgStore, StoreConfig
from tests.clocks import FakeClock as Clock
from tests.conftest import PgServer
from tests.helpers import enqueue, query, worker_config

HOUR = Keep(seconds=3600, max_bytes=1 << 30)


@pytest.fixture
def stores(pg_dsn: str) -> Iterator[list[PgStore]]:
    """Stores the test opens (closed at the end, and before the database is swapped)."""
    opened: list[PgStore] = []
    yield opened
    for store in opened:
        store.close()


def _store(stores: list[PgStore], dsn: str) -> PgStore:
    store = PgStore(StoreConfig(dsn=dsn, connect_timeout_s=3, statement_timeout_s=5))
    stores.append(store)
    return store


def _admin(server: PgServer, statement: sql.Composable) -> None:
    with psycopg.connect(server.admin_dsn, autocommit=True) as conn:
        conn.execute(statement)


def _snapshot(server: PgServer, dsn: str, stores: list[PgStore]) -> str:
    """A copy of the database as it is now (no session may be open on it meanwhile)."""
    for store in stores:
        store.close()
    name = conninfo_to_dict(dsn)["dbname"]
    copy = f"{name}_then"
    _admin(server, sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(copy), sql.Identifier(name)))
    return copy


def _go_back(server: PgServer, dsn: str, copy: str, stores: list[PgStore]) -> None:
    """The database becomes the copy: everything since it was taken is gone."""
    for store in stores:
        store.close()
    name = conninfo_to_dict(dsn)["dbname"]
    _admin(server, sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
    _admin(server, sql.SQL("ALTER DATABASE {} RENAME TO {}").format(sql.Identifier(copy), sql.Identifier(name)))


def _write_done(directory: Path, jobs: list[ClaimedJob]) -> None:
    with ShardWriter.open(str(directory), 0) as writer:
        for job in jobs:
            writer.append_bytes(wire.encode_outcome(
                Outcome.done(job.id, job.attempt, f'{{"n": {job.id}}}'.encode()).claimed_by(job)))
        writer.commit()


def _flusher(directory: Path, store: PgStore, keep: Keep = HOUR) -> Flusher:
    layout.resolve_worker_id(str(directory), "w1")
    reader = OutboxReader.open(str(directory), keep)
    clock = Clock()
    return Flusher(reader, store, worker_config().flusher_config(), clock=clock, sleep=clock.sleep,
                   marks=marks_for(reader, store, worker_config(reapply_window_s=keep.seconds).flusher_config()))


def _held_longer_than_the_grace(dsn: str) -> int:
    """Holds on claims that outlast what a finished re-apply keeps (``REAPPLIED_GRACE_S``)."""
    return int(query(dsn, "SELECT count(*) FROM shardworker.claim_holds WHERE until > now() + %s * interval '1 s'",
                     REAPPLIED_GRACE_S + 0.5)[0][0])


def _drain(flusher: Flusher, passes: int = 20) -> None:
    for _ in range(passes):
        flusher.run_once()
        if flusher.idle and not flusher.reapplying:
            return
    raise AssertionError(f"not idle after {passes} passes: {flusher.stats}")


def test_outcomes_the_database_lost_land_again_from_the_kept_tail(
        pg_server: PgServer, pg_dsn: str, stores: list[PgStore], tmp_path: Path) -> None:
    """Ten jobs done; the database goes back to when five were claimed and none done: the
    flusher finds it at its next check, holds claims, and lands all ten again (the five whose
    claims were lost too), then lets claims go."""
    enqueue(pg_dsn, "k", 10)
    store = _store(stores, pg_dsn)
    first = store.claim(["k"], None, "w1", 5, "a" * 32)
    copy = _snapshot(pg_server, pg_dsn, stores)
    second = store.claim(["k"], None, "w1", 5, "b" * 32)
    _write_done(tmp_path, first + second)
    flusher = _flusher(tmp_path, store)
    _drain(flusher)
    assert dict(query(pg_dsn, "SELECT status, count(*) FROM shardworker.jobs GROUP BY 1")) == {"done": 10}
    _go_back(pg_server, pg_dsn, copy, stores)
    assert dict(query(pg_dsn, "SELECT status, count(*) FROM shardworker.jobs GROUP BY 1")) == {"running": 5,
                                                                                                "queued": 5}
    flusher.check_wanted = True  # as the worker asks when it reaches a new server
    flusher.run_once()
    assert flusher.reapplying and flusher.stats.regressions == 1
    other = _store(stores, pg_dsn)
    assert other.claim(["k"], None, "w2", 10, "c" * 32) == []  # every worker's claims are held meanwhile
    _drain(flusher)
    rows = query(pg_dsn, "SELECT id, status, attempt, result FROM shardworker.jobs ORDER BY id")
    assert [(status, attempt, result) for _, status, attempt, result in rows] == \
        [("done", 1, {"n": job_id}) for job_id, *_ in rows]
    assert _held_longer_than_the_grace(pg_dsn) == 0


def test_a_batch_on_a_database_that_went_back_is_refused_whole_and_applied_again_after(
        pg_server: PgServer, pg_dsn: str, stores: list[PgStore], tmp_path: Path) -> None:
    """No check asked: the next batch's own transaction finds the database behind, lands
    nothing on top of it, and the kept tail lands first."""
    enqueue(pg_dsn, "k", 6)
    store = _store(stores, pg_dsn)
    jobs = store.claim(["k"], None, "w1", 6, "a" * 32)
    copy = _snapshot(pg_server, pg_dsn, stores)
    _write_done(tmp_path, jobs[:3])
    flusher = _flusher(tmp_path, store)
    _drain(flusher)
    _go_back(pg_server, pg_dsn, copy, stores)
    _write_done(tmp_path, jobs[3:])
    _drain(flusher)
    assert flusher.stats.regressions == 1
    assert query(pg_dsn, "SELECT status, count(*) FROM shardworker.jobs GROUP BY 1") == [("done", 6)]


def test_without_a_kept_tail_the_loss_is_said_and_the_rest_goes_on(
        pg_server: PgServer, pg_dsn: str, stores: list[PgStore], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """Nothing kept (a window of 0): what the database lost cannot land again; the flusher says
    so, lets claims go, and applies what comes next."""
    enqueue(pg_dsn, "k", 4)
    store = _store(stores, pg_dsn)
    jobs = store.claim(["k"], None, "w1", 4, "a" * 32)
    copy = _snapshot(pg_server, pg_dsn, stores)
    _write_done(tmp_path, jobs[:2])
    for _ in range(3):  # two segments: the first sealed and deleted once applied
        flusher = _flusher(tmp_path, store, Keep())
        _drain(flusher)
        flusher.reader.close()
    _go_back(pg_server, pg_dsn, copy, stores)
    _write_done(tmp_path, jobs[2:])
    flusher = _flusher(tmp_path, store, Keep())
    with caplog.at_level("WARNING"):
        _drain(flusher)
    assert "before the oldest applied outcome the outbox keeps" in caplog.text
    assert dict(query(pg_dsn, "SELECT id, status FROM shardworker.jobs")) == {
        jobs[0].id: "running", jobs[1].id: "running", jobs[2].id: "done", jobs[3].id: "done"}
    assert _held_longer_than_the_grace(pg_dsn) == 0


def test_an_idle_flusher_lets_the_kept_tail_go_past_its_window(pg_dsn: str, stores: list[PgStore], tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing more to apply, ever: the kept segments still go once their window has passed (a
    checkpoint deleted them only after a batch, and an idle outbox kept them for good)."""
    import outbox.tail as outbox_tail
    from outbox.segment import list_segments

    enqueue(pg_dsn, "k", 30)
    store = _store(stores, pg_dsn)
    jobs = store.claim(["k"], None, "w1", 30, "a" * 32)
    for chunk in (jobs[:10], jobs[10:20], jobs[20:]):  # three segments, each sealed by its writer's close
        _write_done(tmp_path, chunk)
    flusher = _flusher(tmp_path, store, Keep(seconds=60, max_bytes=1 << 30))
    _drain(flusher)
    for _ in range(3):  # idle: nothing to apply, no seal to pass, the checkpoint written
        flusher.clock.now += 1  # type: ignore[attr-defined]
        flusher.run_once()
    assert flusher.idle
    kept = len(list_segments(str(tmp_path))[0])
    assert kept >= 3
    later = time.time() + 120
    monkeypatch.setattr(outbox_tail.time, "time", lambda: later)
    assert isinstance(flusher.clock, Clock)
    flusher.clock.now += 11
    flusher.run_once()
    assert len(list_segments(str(tmp_path))[0]) < kept
