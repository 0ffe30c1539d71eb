"""The outbox's records: what a child or the parent appends and the flusher applies.

The outcome record (``encode_outcome`` / ``decode_outcome``): a fixed header, then the
result's JSON bytes exactly as the child encoded them, then the error text, then (version 4
only) the follow-up jobs the handler enqueued (``shardworker.followups``, JSON)::

    u8 version (2 or 4) | i64 job id | i32 attempt | u8 code | f64 retry delay
    | i32 result length (-1: none) | i32 error length (-1: none)
    | (version 4) i32 follow-ups length | result | error (UTF-8) | follow-ups

where code is the disposition (``_CODES``: 0 a failed attempt, retried after the delay, or for
good when the delay is -1; 1 done; 2 snoozed; 3 cancelled): a result is never escaped, decoded
or re-encoded on its way to PostgreSQL. An outcome without follow-ups is written as version 2.
No record is over ``outbox.MAX_RECORD_BYTES``: such an outcome is replaced by a failure that
says so.

The step record (``encode_step``) is what ``job.step`` appends, with the outcomes, for the
same flusher (``decode_record`` tells them apart, ``step_key`` reads its header)::

    u8 version (3) | i64 job id | i32 attempt | f64 recorded at (Unix s)
    | i32 name length | i32 result length | name (UTF-8) | result (JSON, UTF-8)
"""

from __future__ import annotations

import struct

from outbox import MAX_RECORD_BYTES
from shardworker.model import Disposition, Outcome, StepRecord

JobKey = tuple[int, int]  # (job id, attempt)

_RECORD = struct.Struct("<BqiBdii")
_RECORD_V2 = 2
_FOLLOWUPS = struct.Struct("<i")  # version 4: the follow-ups' length, after the header
_RECORD_V4 = 4
_CODES = {Disposition.RETRY: 0, Disposition.FAILED: 0, Disposition.DONE: 1, Disposition.SNOOZED: 2,
          Disposition.CANCELLED: 3}
_FOR_GOOD = -1.0  # the delay of a code-0 record that is not to be retried
_STEP = struct.Struct("<Bqidii")
_STEP_V3 = 3


def encode_outcome(outcome: Outcome) -> bytes:
    """The outbox record of ``outcome``; a too-large one becomes a final failure saying so."""
    result, followups = outcome.result_json, outcome.followups_json
    error = None if outcome.error is None else outcome.error.encode("utf-8", "backslashreplace")
    extra = _FOLLOWUPS.size + len(followups) if followups else 0
    size = _RECORD.size + len(result or b"") + len(error or b"") + extra
    if size > MAX_RECORD_BYTES:
        what = "handler result and follow-up jobs" if followups else "handler result"
        message = f"{what} too large: {size} bytes > {MAX_RECORD_BYTES}"
        outcome = Outcome.failed(outcome.job_id, outcome.attempt, message)
        result, error, followups = None, message.encode(), None
    delay = outcome.delay_s if outcome.disposition in (Disposition.RETRY, Disposition.SNOOZED) else _FOR_GOOD
    header = _RECORD.pack(_RECORD_V4 if followups else _RECORD_V2, outcome.job_id, outcome.attempt,
                          _CODES[outcome.disposition], delay,
                          -1 if result is None else len(result), -1 if error is None else len(error))
    if followups:
        header += _FOLLOWUPS.pack(len(followups))
    return b"".join((header, result or b"", error or b"", followups or b""))


def decode_outcome(record: bytes) -> Outcome:
    """The outcome in an outbox record; ``ValueError`` when it is not one."""
    version, job_id, attempt, code, delay, result_len, error_len = _header(record)
    at = _RECORD.size
    followups_len = -1
    if version == _RECORD_V4:
        if len(record) < at + _FOLLOWUPS.size:
            raise ValueError("not an outcome record: truncated header")
        (followups_len,) = _FOLLOWUPS.unpack_from(record, at)
        at += _FOLLOWUPS.size
    if code > 3 or result_len < -1 or error_len < -1 or followups_len < -1 or (
            at + max(result_len, 0) + max(error_len, 0) + max(followups_len, 0) != len(record)):
        raise ValueError("not an outcome record: inconsistent header")
    result = None if result_len < 0 else bytes(record[at:at + result_len])
    at += max(result_len, 0)
    error = None if error_len < 0 else bytes(record[at:at + error_len]).decode("utf-8")
    at += max(error_len, 0)
    followups = bytes(record[at:]) if followups_len > 0 else None
    disposition = (Disposition.FAILED if delay < 0 else Disposition.RETRY, Disposition.DONE, Disposition.SNOOZED,
                   Disposition.CANCELLED)[code]
    kept = delay if disposition in (Disposition.RETRY, Disposition.SNOOZED) else 0.0
    return Outcome(job_id, attempt, disposition, result, error, kept, followups)


def outcome_key(record: bytes) -> JobKey:
    """(job id, attempt) of an outbox record, read from its header alone."""
    _, job_id, attempt, *_ = _header(record)
    return job_id, attempt


def step_key(record: bytes) -> JobKey | None:
    """(job id, attempt) of a step record, read from its header alone; None for any other record."""
    if len(record) < _STEP.size or record[0] != _STEP_V3:
        return None
    _, job_id, attempt, *_ = _STEP.unpack_from(record)
    return job_id, attempt


def encode_step(step: StepRecord) -> bytes:
    """The outbox record of a step's result (the caller keeps it within the result limit)."""
    name = step.name.encode("utf-8")
    return b"".join((_STEP.pack(_STEP_V3, step.job_id, step.attempt, step.recorded_at, len(name),
                                len(step.result_json)), name, step.result_json))


def decode_record(record: bytes) -> Outcome | StepRecord:
    """The outcome or the step in an outbox record; ``ValueError`` when it is neither."""
    if step_key(record) is None:
        return decode_outcome(record)  # or ValueError: neither
    _, job_id, attempt, recorded_at, name_len, result_len = _STEP.unpack_from(record)
    if name_len < 1 or result_len < 1 or _STEP.size + name_len + result_len != len(record):
        raise ValueError("not a step record: inconsistent header")
    at = _STEP.size + name_len
    return StepRecord(job_id, attempt, bytes(record[_STEP.size:at]).decode(), bytes(record[at:]), recorded_at)


def _header(record: bytes) -> tuple[int, int, int, int, float, int, int]:
    if len(record) < _RECORD.size or record[0] not in (_RECORD_V2, _RECORD_V4):
        raise ValueError(f"not an outcome record: {bytes(record[:16])!r}")
    return _RECORD.unpack_from(record)
