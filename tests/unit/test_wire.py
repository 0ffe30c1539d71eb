"""Unit tests of the outcome record format in ``shardworker.core.wire``: round trips, garbage and
earlier formats refused, the result's bytes kept verbatim, oversized outcomes."""

from __future__ import annotations

import orjson
import pytest

from shardworker.core.model import Disposition, Outcome
from shardworker.core.records import NEWEST_VERSION, decode_record
from shardworker.core.wire import decode_outcome, encode_outcome, outcome_key
from shardworker.errors import NewerRecord


@pytest.mark.parametrize("outcome", [
    Outcome.done(1, 1, b'{"bytes": 123}'),
    Outcome.retry(2**62, 25, "boom\nwith newline", 12.5),
    Outcome.failed(3, 2, "no retry"),
    Outcome.done(4, 1, b"null"),
])
def test_outcome_round_trips_through_wire_format(outcome: Outcome) -> None:
    """encode_outcome then decode_outcome give back an equal Outcome."""
    assert decode_outcome(encode_outcome(outcome)) == outcome


@pytest.mark.parametrize("garbage", [
    None, 42, "text", {"job_id": 1}, [], [1, 2, True, None, None], [1, 2, True, None, None, 0.0, "extra"],
    ["x", 1, True, None, None, 0.0], [1, 1, True, None, None, "soon"], [None, 1, True, None, None, 0.0],
])
def test_decode_outcome_rejects_garbage(garbage: object) -> None:
    """A value that is not a six-item outcome list with numeric id, attempt and delay raises."""
    with pytest.raises((ValueError, TypeError)):
        decode_outcome(orjson.dumps(garbage))


def test_an_outcome_record_carries_the_result_bytes_verbatim_after_a_fixed_header() -> None:
    """The result's JSON bytes appear in the record as they are, unescaped, at its end."""
    result = orjson.dumps({"text": 'quote " and \\ backslash', "n": [1, 2]})
    record = encode_outcome(Outcome.done(9, 3, result))
    assert record.endswith(result) and len(record) == 30 + len(result)
    assert outcome_key(record) == (9, 3)


def test_records_of_an_unreleased_earlier_format_are_refused() -> None:
    """Only the current record format decodes (the project was never released with another):
    a JSON-array record of the first development format is not an outcome."""
    old = orjson.dumps([5, 2, True, '{"a": 1}', None, 0.0])
    with pytest.raises(ValueError, match="not an outcome record"):
        decode_outcome(old)
    with pytest.raises(ValueError, match="not an outcome record"):
        outcome_key(old)


@pytest.mark.parametrize("cut", [1, 10, 29, 31])
def test_a_truncated_or_padded_record_is_refused(cut: int) -> None:
    record = encode_outcome(Outcome.done(1, 1, b'"abc"'))
    with pytest.raises(ValueError):
        decode_outcome(record[:cut] if cut < len(record) else record + b"x")
    with pytest.raises(ValueError):
        decode_outcome(record + b"\0")


def test_an_outcome_too_big_for_a_record_becomes_a_final_failure_saying_so() -> None:
    from outbox import MAX_RECORD_BYTES

    record = encode_outcome(Outcome.done(1, 1, b"1" * MAX_RECORD_BYTES))
    outcome = decode_outcome(record)
    assert (outcome.disposition, outcome.result_json) == (Disposition.FAILED, None)
    assert outcome.error is not None and "too large" in outcome.error


def test_a_step_record_round_trips_and_its_key_reads_from_the_header() -> None:
    """encode_step then decode_record give the step back; step_key reads (id, attempt) from a
    step record only, and outcome_key refuses one (a step is never taken for an outcome)."""
    from shardworker.core.model import StepRecord
    from shardworker.core.wire import decode_record, encode_step, step_key

    step = StepRecord(9, 3, "ocr ✓", b'{"pages":[1,2]}', 1700000000.5)
    record = encode_step(step)
    assert decode_record(record) == step and step_key(record) == (9, 3)
    outcome = encode_outcome(Outcome.done(9, 3, b"1"))
    assert step_key(outcome) is None and decode_record(outcome) == Outcome.done(9, 3, b"1")
    with pytest.raises(ValueError):
        outcome_key(record)
    with pytest.raises(ValueError):
        decode_record(record[:-1])


def test_a_record_of_a_newer_format_is_told_apart_from_damage() -> None:
    """A version byte above the newest this release writes is a newer release's record (a
    rollback): ``NewerRecord``, which the flusher stops on, not a plain ``ValueError``, which
    it dead-letters. It is still a ``ValueError`` for the readers that only skip records."""
    record = bytearray(encode_outcome(Outcome.done(9, 3, b"1")))
    record[0] = NEWEST_VERSION + 1
    with pytest.raises(NewerRecord, match=f"record version {NEWEST_VERSION + 1}"):
        decode_record(bytes(record))
    with pytest.raises(ValueError):
        outcome_key(bytes(record))
    record[0] = 1  # a version never released: damage, not a newer release
    with pytest.raises(ValueError, match="not an outcome record") as caught:
        decode_record(bytes(record))
    assert not isinstance(caught.value, NewerRecord)


def test_claimed_jobs_reach_a_child_with_their_key() -> None:
    """The pipe message that hands a child its jobs carries each job's key (a tenant's)."""
    from shardworker.core.model import ClaimedJob
    from shardworker.core.wire import Jobs, decode, encode

    jobs = (ClaimedJob(1, "k", "default", "{}", 1, 25, key="tenant-1"), ClaimedJob(2, "k", "default", "{}", 1, 25))
    message = decode(encode(Jobs(jobs, (0, 0))))
    assert isinstance(message, Jobs) and [j.key for j in message.jobs] == ["tenant-1", None]
    assert message.jobs[0].to_job().key == "tenant-1"
