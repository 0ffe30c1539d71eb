"""``Outage``: the failure state every database loop keeps (the dispatcher's claims, the
flusher, the heartbeat, housekeeping, ``retry_call``)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from shardworker.core.retry import Backoff, Outage, retry_call
from shardworker.errors import DatabaseUnavailable, DataRejected, TransientConflict
from tests.clocks import FakeClock as Clock


def outage(caplog: pytest.LogCaptureFixture, **options: Any) -> tuple[Outage, Clock]:
    caplog.set_level(logging.DEBUG, logger="test.outage")
    clock = Clock(100.0)
    return Outage("beat", logging.getLogger("test.outage"), Backoff(0.1, 1.0), clock=clock,
                  started="{what} failed ({error})", ended="{what} back after {seconds:.0f}s, {failures} failures",
                  **options), clock


def test_an_outage_is_told_once_when_it_starts_and_once_when_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    o, clock = outage(caplog, tell_unreachable=True)
    for _ in range(5):
        o.failed(DatabaseUnavailable("database unavailable: refused"))
        clock.now += 2
    o.recovered()
    o.recovered()  # nothing more to tell
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "beat failed (database unavailable: refused)"),
        (logging.INFO, "beat back after 10s, 5 failures")]
    assert o.since is None and o.failures == 0 and o.unreachable == ""


def test_an_unreachable_database_is_left_to_the_watch_but_a_conflict_is_told(
        caplog: pytest.LogCaptureFixture) -> None:
    """In a worker the parent's watch tells of the database once; a loop's own line is
    DEBUG for that, WARNING for any other retryable failure."""
    o, _ = outage(caplog)
    o.failed(DatabaseUnavailable("database unavailable: gone"))
    assert o.unreachable == "database unavailable: gone"
    o.recovered()
    o.failed(TransientConflict("transient conflict: deadlock"))
    assert o.unreachable == ""
    assert [r.levelno for r in caplog.records] == [logging.DEBUG, logging.DEBUG, logging.WARNING]


def test_only_retryable_errors_are_retried(caplog: pytest.LogCaptureFixture) -> None:
    o, _ = outage(caplog)
    refused = DataRejected("database refused: value too long")
    with pytest.raises(DataRejected):
        o.failed(refused)
    with pytest.raises(ValueError):
        o.failed(ValueError("a bug"))
    assert o.since is None and o.failures == 0 and caplog.records == []


def test_the_delay_grows_but_never_under_the_loops_own_pace(caplog: pytest.LogCaptureFixture) -> None:
    o, _ = outage(caplog, floor_s=0.5)
    delays = [o.failed(DatabaseUnavailable("x")) for _ in range(8)]
    assert all(0.5 <= d <= 1.0 for d in delays)
    assert o.failures == 8


def test_retry_call_gives_up_on_a_refusal_at_once() -> None:
    calls = []

    def refuse() -> None:
        calls.append(1)
        raise DataRejected("database refused: no")

    with pytest.raises(DataRejected):
        retry_call(refuse, "refusing", backoff=Backoff(0.01, 0.02), log=logging.getLogger("t"), sleep=lambda s: None)
    assert calls == [1]


def test_retry_call_retries_an_outage_until_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="t")
    results = iter([DatabaseUnavailable("down"), DatabaseUnavailable("down"), 42])

    def flaky() -> int:
        value = next(results)
        if isinstance(value, Exception):
            raise value
        return value

    assert retry_call(flaky, "asking", backoff=Backoff(0.01, 0.02), log=logging.getLogger("t"),
                      sleep=lambda s: None) == 42
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.INFO]
    assert caplog.records[-1].getMessage() == "asking succeeded after 2 failed attempts"
