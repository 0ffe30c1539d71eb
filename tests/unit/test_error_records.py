"""The outcome record of a failed attempt carries its traceback and when it failed (record
version 5); records written by the previous release (versions 2 and 4) still decode, so an
outbox left by it drains. A traceback is bounded in the child, keeping its end."""

from __future__ import annotations

import struct

import pytest

from shardworker import App
from shardworker.child.handlers import run_sync
from shardworker.core.limits import MAX_TRACEBACK_BYTES
from shardworker.core.model import ClaimedJob, Disposition, Outcome
from shardworker.core.wire import decode_outcome, encode_outcome, outcome_key

# Records as the previous release wrote them: a failed attempt (version 2, its traceback inside
# the error text) and a done one with a follow-up job (version 4).
_HEADER = struct.Struct("<BqiBdii")
OLD_RETRY = _HEADER.pack(2, 7, 3, 0, 1.5, -1, 13) + b"ValueError: x"
OLD_FOLLOWUP = _HEADER.pack(4, 8, 1, 1, -1.0, 1, -1) + struct.pack("<i", 2) + b"1" + b"[]"


@pytest.mark.parametrize("outcome", [
    Outcome.retry(1, 2, "ValueError: boom", 3.0, traceback="Traceback (most recent call last):\n  x\nValueError: boom",
                  failed_at=1700000000.25),
    Outcome.failed(2, 5, "Fail: no", traceback=None, failed_at=1700000001.0),
    Outcome.retry(3, 1, "timed out after 5s", 0.5, traceback="tb ✓", failed_at=None),
])
def test_a_failed_attempt_round_trips_with_its_traceback_and_time(outcome: Outcome) -> None:
    record = encode_outcome(outcome)
    assert record[0] == 5 and decode_outcome(record) == outcome and outcome_key(record) == (outcome.job_id,
                                                                                           outcome.attempt)


def test_records_of_the_previous_release_still_decode() -> None:
    assert decode_outcome(OLD_RETRY) == Outcome.retry(7, 3, "ValueError: x", 1.5)
    assert decode_outcome(OLD_FOLLOWUP) == Outcome.done(8, 1, b"1", b"[]")


def test_outcomes_without_a_failure_keep_the_earlier_versions() -> None:
    assert encode_outcome(Outcome.done(1, 1, b"1"))[0] == 2
    assert encode_outcome(Outcome.done(1, 1, b"1", b"[]"))[0] == 4


@pytest.mark.parametrize("cut", [1, 40, 45])
def test_a_truncated_version_5_record_is_refused(cut: int) -> None:
    record = encode_outcome(Outcome.retry(1, 1, "e", 1.0, traceback="tb", failed_at=1.0))
    with pytest.raises(ValueError):
        decode_outcome(record[:-cut])
    with pytest.raises(ValueError):
        decode_outcome(record + b"x")


def _recurse(n: int) -> int:
    return _recurse(n + 1) + 1


def _a(n: int) -> int:
    return _b(n + 1)


def _b(n: int) -> int:
    return _a(n + 1)


@pytest.mark.parametrize("fn", [_recurse, _a])
def test_a_deep_recursion_leaves_a_bounded_traceback_that_keeps_its_end(fn: object) -> None:
    app = App()
    app.handler("deep")(lambda job: fn(0))  # type: ignore[operator]
    outcome = run_sync(app, ClaimedJob(1, "deep", "default", "null", 1, 25))
    assert outcome.disposition is Disposition.RETRY and outcome.traceback is not None
    assert len(outcome.traceback.encode()) <= MAX_TRACEBACK_BYTES
    assert outcome.traceback.rstrip().endswith("RecursionError: maximum recursion depth exceeded")
    assert outcome.error == "RecursionError: maximum recursion depth exceeded"
    assert outcome.failed_at is not None


def test_a_handler_error_keeps_its_message_and_traceback_apart() -> None:
    app = App()

    @app.handler("k")
    def k(job: object) -> None:
        raise KeyError("missing")

    outcome = run_sync(app, ClaimedJob(1, "k", "default", "null", 1, 25))
    assert outcome.error == "KeyError: 'missing'"
    assert outcome.traceback is not None and outcome.traceback.startswith("Traceback (most recent call last):")
    assert 'raise KeyError("missing")' in outcome.traceback
