"""An operator's cancel reaching the dispatcher (``Dispatcher.run_once`` in-process on a real
PostgreSQL, the children a stand-in that records what it is told to stop, the clock injected
and standing still, so the 2 s poll never falls due unless a test moves it)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg

from shardworker import jobs
from shardworker.embedded import EmbeddedPostgres
from shardworker.store.pg_store import PgStore, StoreConfig
from shardworker.worker.dispatcher import LOOK_S
from tests.flaky_store import FlakyStore
from tests.helpers import enqueue
from tests.worker.dispatcher_harness import Children, Clock, make


def holding_one(pg_dsn: str, store: FlakyStore, tmp_path: Path) -> tuple[object, Children, Clock, int]:
    """A dispatcher whose one child holds one job, attempt 1."""
    [job_id] = enqueue(pg_dsn, "k", 1)
    dispatcher, children, _, clock = make(store, tmp_path, procs=1)
    dispatcher.run_once()
    dispatcher.run_once()  # finds nothing more, waits: LISTENs
    assert children.job_keys() == [(job_id, 1)] and store.store.listening
    return dispatcher, children, clock, job_id


def cancel_during_a_query(pg_dsn: str, store: FlakyStore, job_id: int) -> None:
    """Cancel ``job_id`` from another connection while the claim connection runs a query."""
    def cancel_soon() -> None:
        time.sleep(0.15)
        assert jobs.cancel(pg_dsn, [job_id]) == 1

    canceller = threading.Thread(target=cancel_soon)
    canceller.start()
    with store.store.cursor() as cur:  # the claim connection, busy while the notification comes
        cur.execute("SELECT pg_sleep(0.6)")
    canceller.join()


def test_a_cancel_that_arrives_during_a_query_reaches_the_children_at_the_next_pass(
        pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """psycopg keeps a notification that arrives while its connection runs a query, and the
    connection's descriptor does not turn readable for it. The dispatcher's wait looked only
    when it did, so a cancel that came during a claim waited for the next notification or the
    poll: 2 to 4 s for a new user."""
    dispatcher, children, _, job_id = holding_one(pg_dsn, store, tmp_path)

    cancel_during_a_query(pg_dsn, store, job_id)
    for _ in range(3):
        dispatcher.run_once()
    assert children.cancelled == [{(job_id, 1)}]


def test_a_cancel_that_arrives_during_a_claim_reaches_the_children_though_every_pass_claims(
        pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """A busy worker claims at every pass and never waits: notifications kept during its claims
    must still be looked at, every LOOK_S (a review point: they waited for the 2 s poll)."""
    dispatcher, children, clock, job_id = holding_one(pg_dsn, store, tmp_path)

    cancel_during_a_query(pg_dsn, store, job_id)
    enqueue(pg_dsn, "k", 1)
    dispatcher.demand.wake()  # more work: this pass claims, and does not wait
    clock.now += LOOK_S
    assert dispatcher.run_once() is False and dispatcher.claimed_total == 2
    dispatcher.run_once()
    assert children.cancelled == [{(job_id, 1)}]


def test_a_cancel_stops_the_attempt_it_cancelled_not_the_retry_claimed_before_it_was_heard(
        pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """Cancelled and retried at once; this worker claims the retry (attempt 2) before it
    reads the cancel. The cancel named the job only, and the worker stopped every attempt of
    it it held: the retry was killed and charged (found by a new user). It names the attempt."""
    dispatcher, children, _, job_id = holding_one(pg_dsn, store, tmp_path)
    with psycopg.connect(pg_dsn) as conn:  # one commit: the cancel and the retry's wake-up together
        assert jobs.cancel(conn, [job_id]) == 1
        assert jobs.retry(conn, [job_id]) == 1
    dispatcher.demand.wake()  # (as after any notification) this pass claims before it reads the others
    dispatcher.run_once()
    assert sorted(children.job_keys()) == [(job_id, 1), (job_id, 2)]
    for _ in range(3):
        dispatcher.run_once()
    assert children.cancelled == [{(job_id, 1)}]


def test_the_poll_finds_a_cancelled_attempt_whose_notification_was_missed_even_once_retried(
        pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """The poll behind the notifications (every 2 s) names attempts too: it finds the attempt
    held here whose job was cancelled, or has moved on to a later attempt (cancelled, retried
    and claimed again, here by another worker)."""
    dispatcher, children, clock, job_id = holding_one(pg_dsn, store, tmp_path)
    with psycopg.connect(pg_dsn) as conn:
        assert jobs.cancel(conn, [job_id]) == 1
        assert jobs.retry(conn, [job_id]) == 1
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # another worker claims the retry
        conn.execute("UPDATE shardworker.jobs SET status = 'running', attempt = 2, locked_by = 'w2' WHERE id = %s",
                     (job_id,))
    store.store.wait_notify(0.5)
    store.store.take_cancelled()  # the notification lost, as when the connection was away
    dispatcher.run_once()
    assert children.cancelled == []
    clock.now += 2.5
    dispatcher.run_once()
    assert children.cancelled == [{(job_id, 1)}]


def test_a_server_gone_while_the_dispatcher_waits_is_an_outage_not_a_crash(
        private_pg: EmbeddedPostgres, tmp_path: Path) -> None:
    """The look for notifications kept during a query, before the wait on the LISTEN
    connection's descriptor, never opens a connection and comes before the descriptor is
    taken. Its first version took the descriptor first and could replace the connection
    under it: the outage demo's worker then stopped on "Bad file descriptor" (1 run in 4;
    this in-process test did not catch that race, it checks the outage path around it)."""
    real = PgStore(StoreConfig(dsn=private_pg.dsn, connect_timeout_s=2, statement_timeout_s=2))
    try:
        store = FlakyStore(real)
        enqueue(private_pg.dsn, "k", 1)
        # A short backoff: the restart is a new server, and claims wait for every worker to look (the
        # backoff's cap and 2 s, by the database's clock: reapply_watch).
        dispatcher, children, _, clock = make(store, tmp_path, procs=1, prefetch=1, backoff_cap_s=0.5,
                                              heartbeat_interval_s=0.5, rescue_after_s=60)
        dispatcher.run_once()
        dispatcher.run_once()  # its one child full: no claim, a wait, which LISTENs
        assert real.listening and len(children.job_keys()) == 1
        private_pg.stop("fast")  # a fast stop tells each connection so: the look reads it, and fails
        for _ in range(3):  # still full: no claim finds the server gone first
            dispatcher.run_once()
            clock.now += 1.0
        assert not dispatcher.db_ok
        private_pg.start()
        enqueue(private_pg.dsn, "k", 1)
        children.finish(0, 1)
        for _ in range(200):
            clock.now += 1.0
            dispatcher.run_once()
            if dispatcher.claimed_total == 2:
                break
            time.sleep(0.05)
        assert dispatcher.claimed_total == 2 and dispatcher.db_ok
    finally:
        real.close()
