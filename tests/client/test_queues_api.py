"""``shardworker.queues`` from Python: list, pause, resume and limit queues on a DSN or on the
caller's connection (inside its transaction, or committed at once), and every bad name,
rate or combination refused with one ``ConfigError`` before anything is written. Real
PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from shardworker import queues
from shardworker.core.flow import Rate
from shardworker.errors import ConfigError
from shardworker.queues import QueueInfo, QueueState
from tests.helpers import enqueue, query


def test_list_pause_limit_and_resume_on_a_dsn(pg_dsn: str) -> None:
    """A queue with jobs is listed without a state row; pausing and limiting show in the list,
    and a queue known only by its state row is listed with zeros."""
    enqueue(pg_dsn, "send", 3, queue="mail")
    enqueue(pg_dsn, "send", 1, queue="mail", run_at=datetime.now(UTC) + timedelta(hours=1))
    [mail] = queues.list_queues(pg_dsn)
    assert (mail.name, mail.paused, mail.concurrency, mail.rate, mail.available, mail.scheduled) == \
        ("mail", False, None, None, 3, 1)
    assert mail.oldest_available_s is not None and mail.oldest_available_s >= 0
    assert queues.pause(pg_dsn, "mail") == QueueState("mail", True, None, None)
    assert queues.limit(pg_dsn, "mail", concurrency=2, rate="10/s") == QueueState("mail", True, 2, Rate(10, 1.0))
    assert queues.limit(pg_dsn, "idle", rate=Rate(3, 60.0)).rate == Rate(3, 60.0)
    listed = queues.list_queues(pg_dsn)
    assert [q.name for q in listed] == ["idle", "mail"]
    assert listed[0] == QueueInfo("idle", False, None, Rate(3, 60.0), 0, 0, 0, 0, None)
    assert listed[1].to_json()["rate"] == "10/s" and listed[1].to_json()["concurrency"] == 2
    assert queues.resume(pg_dsn, "mail") == QueueState("mail", False, 2, Rate(10, 1.0))
    assert queues.limit(pg_dsn, "mail", clear=True) == QueueState("mail", False, None, None)


def test_on_the_callers_connection_changes_join_its_transaction(pg_dsn: str) -> None:
    """Inside the caller's open transaction a pause is the caller's to commit or roll back."""
    with psycopg.connect(pg_dsn) as conn:
        with conn.transaction(force_rollback=True):
            queues.pause(conn, "mail")
            assert queues.list_queues(conn)[0].paused
        assert queues.list_queues(conn) == []
        queues.pause(conn, "mail")  # no transaction open: committed at once
    assert query(pg_dsn, "SELECT name, paused FROM shardworker.queues") == [("mail", True)]


@pytest.mark.parametrize(("call", "message"), [
    (lambda dsn: queues.pause(dsn, ""), "queue name is empty"),
    (lambda dsn: queues.resume(dsn, "q" * 256), "the limit is 255"),
    (lambda dsn: queues.pause(dsn, "a\x00b"), "NUL"),
    (lambda dsn: queues.pause(dsn, 7), "queue name must be a string"),
    (lambda dsn: queues.limit(dsn, "mail", rate="10/day"), "rate must look like 10/s"),
    (lambda dsn: queues.limit(dsn, "mail", rate="0/s"), "rate must look like 10/s"),
    (lambda dsn: queues.limit(dsn, "mail", concurrency=0), "concurrency must be a whole number from 1"),
    (lambda dsn: queues.limit(dsn, "mail", concurrency=True), "concurrency must be a whole number from 1"),
    (lambda dsn: queues.limit(dsn, "mail", concurrency=2**31), "concurrency must be a whole number from 1"),
    (lambda dsn: queues.limit(dsn, "mail", clear=True, concurrency=3), "clear removes every limit"),
    (lambda dsn: queues.limit(dsn, "mail"), "give a concurrency, a key concurrency, a rate, or clear"),
])
def test_bad_input_is_one_config_error_and_writes_nothing(pg_dsn: str, call: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        call(pg_dsn)  # type: ignore[operator]
    assert "\n" not in str(caught.value)
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.queues") == [(0,)]
