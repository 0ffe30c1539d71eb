"""The outbox's records: what a child or the parent appends and the flusher applies.

The outcome record (``encode_outcome`` / ``decode_outcome``): a fixed header, then the
result's JSON bytes exactly as the child encoded them, then the error text, then (versions 4
and 5) the follow-up jobs the handler enqueued (``shardworker.followups``, JSON), then
(version 5) a failed attempt's traceback::

    u8 version (2, 4 or 5) | i64 job id | i32 attempt | u8 code | f64 retry delay
    | i32 result length (-1: none) | i32 error length (-1: none)
    | (versions 4, 5) i32 follow-ups length (-1: none)
    | (version 5) f64 failed at (Unix s; NaN: unknown) | i32 traceback length (-1: none)
    | result | error (UTF-8) | follow-ups | traceback (UTF-8)

where code is the disposition (``_CODES``: 0 a failed attempt, retried after the delay, or for
good when the delay is -1; 1 done; 2 snoozed; 3 cancelled): a result is never escaped, decoded
or re-encoded on its way to PostgreSQL. A failed attempt with a traceback or a time is written
as version 5, any other outcome as version 4 with follow-ups and 2 without, as the release
before version 5 wrote them all (its outboxes still drain). No record is over
``outbox.MAX_RECORD_BYTES``: such an outcome is replaced by a failure that says so.

The step record (``encode_step``) is what ``job.step`` appends, with the outcomes, for the
same flusher (``decode_record`` tells them apart, ``step_key`` reads its header)::

    u8 version (3) | i64 job id | i32 attempt | f64 recorded at (Unix s)
    | i32 name length | i32 result length | name (UTF-8) | result (JSON, UTF-8)
"""

from __future__ import annotations

import math
import struct

from outbox import MAX_RECORD_BYTES
from shardworker.errors import NewerRecord
from shardworker.model import Disposition, Outcome, StepRecord

JobKey = tuple[int, int]  # (job id, attempt)
CancelKey = tuple[int, int | None]  # a cancel's (job id, attempt); None: every attempt (an older release's cancel)

_RECORD = struct.Struct("<BqiBdii")
_RECORD_V2 = 2
_FOLLOWUPS = struct.Struct("<i")  # version 4: the follow-ups' length, after the header
_RECORD_V4 = 4
_FAILURE = struct.Struct("<idi")  # version 5: follow-ups length, failed at, traceback length
_RECORD_V5 = 5
_CODES = {Disposition.RETRY: 0, Disposition.FAILED: 0, Disposition.DONE: 1, Disposition.SNOOZED: 2,
          Disposition.CANCELLED: 3}
_FOR_GOOD = -1.0  # the delay of a code-0 record that is not to be retried
_STEP = struct.Struct("<Bqidii")
_STEP_V3 = 3
NEWEST_VERSION = _RECORD_V5  # a record above it was written by a newer release (NewerRecord)
_VERSIONS_END = 32  # first bytes from here on are not versions: the unreleased JSON format began with "["


def encode_outcome(outcome: Outcome) -> bytes:
    """The outbox record of ``outcome``; a too-large one becomes a final failure saying so."""
    result, followups = outcome.result_json, outcome.followups_json
    error, traceback = _utf8(outcome.error), _utf8(outcome.traceback)
    failure = traceback is not None or outcome.failed_at is not None
    extra = _FAILURE.size if failure else _FOLLOWUPS.size if followups else 0
    size = _RECORD.size + extra + sum(len(part or b"") for part in (result, error, followups, traceback))
    if size > MAX_RECORD_BYTES:
        what = ("handler result and follow-up jobs" if followups else "handler result" if result is not None
                else "error and traceback")
        message = f"{what} too large: {size} bytes > {MAX_RECORD_BYTES}"
        outcome = Outcome.failed(outcome.job_id, outcome.attempt, message)
        result, error, followups, traceback, failure = None, message.encode(), None, None, False
    delay = outcome.delay_s if outcome.disposition in (Disposition.RETRY, Disposition.SNOOZED) else _FOR_GOOD
    version = _RECORD_V5 if failure else _RECORD_V4 if followups else _RECORD_V2
    header = _RECORD.pack(version, outcome.job_id, outcome.attempt, _CODES[outcome.disposition], delay,
                          _length(result), _length(error))
    if failure:
        failed_at = math.nan if outcome.failed_at is None else outcome.failed_at
        header += _FAILURE.pack(_length(followups), failed_at, _length(traceback))
    elif followups:
        header += _FOLLOWUPS.pack(len(followups))
    return b"".join((header, result or b"", error or b"", followups or b"", traceback or b""))


def decode_outcome(record: bytes) -> Outcome:
    """The outcome in an outbox record; ``ValueError`` when it is not one."""
    version, job_id, attempt, code, delay, result_len, error_len = _header(record)
    at = _RECORD.size
    followups_len, failed_at, traceback_len = -1, math.nan, -1
    tail = {_RECORD_V4: _FOLLOWUPS, _RECORD_V5: _FAILURE}.get(version)
    if tail is not None:
        if len(record) < at + tail.size:
            raise ValueError("not an outcome record: truncated header")
        if version == _RECORD_V4:
            (followups_len,) = _FOLLOWUPS.unpack_from(record, at)
        else:
            followups_len, failed_at, traceback_len = _FAILURE.unpack_from(record, at)
        at += tail.size
    lengths = (result_len, error_len, followups_len, traceback_len)
    if code > 3 or min(lengths) < -1 or at + sum(max(n, 0) for n in lengths) != len(record):
        raise ValueError("not an outcome record: inconsistent header")
    result, error, followups, traceback = _parts(record, at, lengths)
    disposition = (Disposition.FAILED if delay < 0 else Disposition.RETRY, Disposition.DONE, Disposition.SNOOZED,
                   Disposition.CANCELLED)[code]
    kept = delay if disposition in (Disposition.RETRY, Disposition.SNOOZED) else 0.0
    return Outcome(job_id, attempt, disposition, result, None if error is None else error.decode("utf-8"), kept,
                   followups or None, None if traceback is None else traceback.decode("utf-8"),
                   None if math.isnan(failed_at) else failed_at)


def _parts(record: bytes, at: int, lengths: tuple[int, ...]) -> list[bytes | None]:
    """The record's parts after its header, each None when its length is -1."""
    parts: list[bytes | None] = []
    for length in lengths:
        parts.append(None if length < 0 else bytes(record[at:at + length]))
        at += max(length, 0)
    return parts


def _utf8(text: str | None) -> bytes | None:
    return None if text is None else text.encode("utf-8", "backslashreplace")


def _length(part: bytes | None) -> int:
    return -1 if part is None else len(part)


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
    if record and NEWEST_VERSION < record[0] < _VERSIONS_END:
        raise NewerRecord(f"record version {record[0]}; this release reads versions up to {NEWEST_VERSION}")
    if len(record) < _RECORD.size or record[0] not in (_RECORD_V2, _RECORD_V4, _RECORD_V5):
        raise ValueError(f"not an outcome record: {bytes(record[:16])!r}")
    return _RECORD.unpack_from(record)
