"""The enqueue API inside a long-running application: no per-call threads, descriptors or
memory, and a borrowed connection stays the caller's (never closed, reconnected, or left in
a transaction it did not open). Real PostgreSQL throughout."""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from shardworker import JobSpec, enqueue, enqueue_many
from shardworker.errors import DatabaseUnavailable, EnqueueError


def connect(dsn: str, *, autocommit: bool = True) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=autocommit, connect_timeout=5)


def job_count(dsn: str) -> int:
    with connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM shardworker.jobs").fetchone()
    assert row is not None
    return int(row[0])


def process_footprint() -> tuple[int, int, int]:
    """(OS threads, open descriptors, resident KiB) of this process, from /proc."""
    threads = os_threads()
    fds = len(os.listdir("/proc/self/fd"))
    with open("/proc/self/status") as status:
        rss_kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return threads, fds, rss_kib


def os_threads(settle_s: float = 1.0) -> int:
    """Threads of this process. A joined thread's OS thread ends a moment after ``join``
    returns, so a count above Python's is re-read until they agree or ``settle_s`` passes."""
    deadline = time.monotonic() + settle_s
    while len(os.listdir("/proc/self/task")) > threading.active_count() and time.monotonic() < deadline:
        time.sleep(0.001)
    return len(os.listdir("/proc/self/task"))


def assert_no_growth(call: Callable[[], object], calls: int, *, max_rss_growth_kib: int = 4096) -> None:
    """After a warm-up, ``calls`` calls leave threads and descriptors unchanged and RSS nearly so.

    Checked every tenth of the way, so a per-call leak fails long before it can exhaust the process.
    """
    for _ in range(min(200, calls)):
        call()
    threads, fds, rss = process_footprint()
    py_threads = threading.active_count()
    step = max(1, calls // 10)
    for done in range(1, calls + 1):
        call()
        if done % step == 0:
            now_threads, now_fds, _ = process_footprint()
            assert (now_threads, threading.active_count(), now_fds) == (threads, py_threads, fds), (
                f"after {done} calls: threads {threads} -> {now_threads}, descriptors {fds} -> {now_fds}; "
                f"running: {[t.name for t in threading.enumerate()]}")
    grown = process_footprint()[2] - rss
    assert grown < max_rss_growth_kib, f"RSS grew by {grown} KiB over {calls} calls"


@pytest.fixture
def conn(pg_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with connect(pg_dsn) as c:
        yield c


@pytest.fixture
def listener(pg_dsn: str) -> Iterator[Callable[[float], bool]]:
    """A connection listening on the workers' wake-up channel; call it to wait for one wake-up."""
    with connect(pg_dsn) as c:
        c.execute("LISTEN shardworker_jobs")

        def woken(timeout_s: float) -> bool:
            if any(True for _ in c.notifies(timeout=0, stop_after=1)):
                return True
            select.select([c.fileno()], [], [], timeout_s)
            return any(True for _ in c.notifies(timeout=0, stop_after=1))

        yield woken


# --- no per-call resources ------------------------------------------------------------------


def test_enqueue_on_a_borrowed_connection_leaves_nothing_behind(conn: psycopg.Connection[Any], pg_dsn: str) -> None:
    """5,000 enqueues on one borrowed connection leave threads and descriptors unchanged, RSS within
    4 MiB (a leak of a kilobyte a call would show)."""
    assert_no_growth(lambda: enqueue(conn, "k", {"n": 1}), 5_000)
    assert job_count(pg_dsn) == 5_200


def test_enqueue_many_on_a_borrowed_connection_leaves_nothing_behind(
        conn: psycopg.Connection[Any], pg_dsn: str) -> None:
    """1,000 bulk enqueues on one borrowed connection leave threads and descriptors unchanged."""
    specs = [JobSpec("k", {"n": n}) for n in range(5)]
    assert_no_growth(lambda: enqueue_many(conn, specs), 1_000)
    assert job_count(pg_dsn) == 1_200 * 5


def test_enqueue_with_a_dsn_leaves_nothing_behind(pg_dsn: str) -> None:
    """Each DSN call opens and closes its own connection (and any deadline thread) before returning."""
    assert_no_growth(lambda: enqueue(pg_dsn, "k"), 100)
    assert_no_growth(lambda: enqueue_many(pg_dsn, [JobSpec("k")]), 50)
    assert job_count(pg_dsn) == (100 + 100) + (50 + 50)  # warm-up + measured calls


# --- a borrowed connection is the caller's --------------------------------------------------


def test_enqueue_in_the_callers_transaction_rolls_back_with_it(
        conn: psycopg.Connection[Any], pg_dsn: str, listener: Callable[[float], bool]) -> None:
    """Inside the caller's transaction a rollback leaves no job and wakes no worker."""
    with pytest.raises(RuntimeError), conn.transaction():
        job_id = enqueue(conn, "k")
        enqueue_many(conn, [JobSpec("k"), JobSpec("k")])
        assert job_id is not None
        raise RuntimeError("the business write failed")
    assert job_count(pg_dsn) == 0
    assert listener(0.3) is False


def test_enqueue_in_the_callers_transaction_commits_with_it(
        conn: psycopg.Connection[Any], pg_dsn: str, listener: Callable[[float], bool]) -> None:
    """Inside the caller's transaction the job appears, and workers wake, only at the caller's commit."""
    with conn.transaction():
        enqueue(conn, "k")
        enqueue_many(conn, [JobSpec("k")])
        enqueue_many(conn, [JobSpec("k")])  # twice in one transaction: the staging table is not left behind
        assert job_count(pg_dsn) == 0
        assert listener(0.3) is False
    assert job_count(pg_dsn) == 3
    assert listener(5.0) is True


def test_enqueue_on_an_idle_non_autocommit_connection_commits_its_own_transaction(pg_dsn: str) -> None:
    """With no transaction open, enqueue opens and commits its own: the caller is never left inside one."""
    with connect(pg_dsn, autocommit=False) as c:
        enqueue(c, "k")
        enqueue_many(c, [JobSpec("k")])
        assert c.info.transaction_status == TransactionStatus.IDLE
        assert job_count(pg_dsn) == 2


def test_enqueue_on_a_non_autocommit_connection_in_a_transaction_joins_it(pg_dsn: str) -> None:
    """A transaction the caller implicitly began stays theirs: enqueue joins it, commit is theirs."""
    with connect(pg_dsn, autocommit=False) as c:
        c.execute("SELECT 1")
        enqueue(c, "k")
        assert c.info.transaction_status == TransactionStatus.INTRANS
        assert job_count(pg_dsn) == 0
        c.rollback()
        assert job_count(pg_dsn) == 0


def test_a_refused_job_leaves_the_borrowed_connection_open_and_usable(
        conn: psycopg.Connection[Any], pg_dsn: str) -> None:
    """A row the database refuses raises EnqueueError; the connection stays open and works."""
    with conn.cursor() as cur:
        cur.execute("ALTER TABLE shardworker.jobs ADD CONSTRAINT no_bad_kind CHECK (kind <> 'bad')")
    with pytest.raises(EnqueueError):
        enqueue(conn, "bad")
    with pytest.raises(EnqueueError):
        enqueue_many(conn, [JobSpec("k"), JobSpec("bad")])
    assert not conn.closed
    assert conn.info.transaction_status == TransactionStatus.IDLE
    assert enqueue(conn, "k") is not None
    assert job_count(pg_dsn) == 1


def test_a_broken_borrowed_connection_is_not_reconnected(conn: psycopg.Connection[Any], pg_dsn: str) -> None:
    """When the caller's connection breaks, enqueue says the database is unavailable and opens nothing."""
    with connect(pg_dsn) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
    fds = process_footprint()[1]
    with pytest.raises(DatabaseUnavailable):
        enqueue(conn, "k")
    with pytest.raises(DatabaseUnavailable):
        enqueue(conn, "k")
    assert process_footprint()[1] <= fds
    assert job_count(pg_dsn) == 0


def test_enqueue_refuses_a_connection_whose_transaction_is_aborted(pg_dsn: str) -> None:
    """A transaction already in error gets a one-line EnqueueError, not a confusing server error."""
    with connect(pg_dsn, autocommit=False) as c:
        with pytest.raises(psycopg.Error):
            c.execute("SELECT 1/0")
        with pytest.raises(EnqueueError, match="roll"):
            enqueue(c, "k")
        c.rollback()
        assert enqueue(c, "k") is not None


def test_enqueue_refuses_what_is_neither_a_dsn_nor_a_connection() -> None:
    """Passing another object (an async connection, a pool) is a one-line EnqueueError."""
    with pytest.raises(EnqueueError, match="connection"):
        enqueue(object(), "k")
    with pytest.raises(EnqueueError, match="connection"):
        enqueue_many(42, [JobSpec("k")])
