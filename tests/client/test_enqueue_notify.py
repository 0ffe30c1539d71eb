"""An enqueue on an autocommit connection commits its row before it notifies workers.

PostgreSQL serialises notifying commits under one lock held across the commit's WAL flush;
with the NOTIFY in its own transaction after the row's commit, concurrent enqueuers no longer
wait for each other's flushes (bench/fleet.py measures it). The test makes the notification
slow (a ``pg_notify`` of the test database's own, first on the enqueuer's search_path, that
sleeps before notifying) and watches the row from another session meanwhile."""

from __future__ import annotations

import threading
import time

import psycopg

from shardworker import enqueue

SLOW_NOTIFY = """
CREATE FUNCTION public.pg_notify(channel text, payload text) RETURNS void LANGUAGE sql AS
$$ SELECT pg_sleep(1.5); SELECT pg_catalog.pg_notify(channel, payload) $$"""


def visible_jobs(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM shardworker.jobs").fetchone()
    assert row is not None
    return int(row[0])


def test_an_autocommit_enqueue_commits_its_row_before_the_notification(pg_dsn: str) -> None:
    """The row is visible to other sessions while the notification is still being sent, and
    the notification still arrives."""
    with psycopg.connect(pg_dsn, autocommit=True) as setup:
        setup.execute(SLOW_NOTIFY)
    with psycopg.connect(pg_dsn, autocommit=True) as listener, \
            psycopg.connect(pg_dsn, autocommit=True, options="-c search_path=public,pg_catalog") as app:
        listener.execute("LISTEN shardworker_jobs")
        ids: list[int | None] = []
        sender = threading.Thread(target=lambda: ids.append(enqueue(app, "k")))
        sender.start()
        deadline = time.monotonic() + 1.0
        while visible_jobs(pg_dsn) == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        seen_early = visible_jobs(pg_dsn)
        sender.join(10)
        assert seen_early == 1
        assert ids and ids[0] is not None
        assert [n.channel for n in listener.notifies(timeout=5, stop_after=1)] == ["shardworker_jobs"]
