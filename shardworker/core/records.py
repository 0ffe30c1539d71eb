"""The outbox's records: what a child or the parent appends and the flusher applies.

The outcome record (``encode_outcome`` / ``decode_outcome``): a fixed header, then the
result's JSON bytes exactly as the child encoded them, then the error text, then (versions 4
to 6, 8) the follow-up jobs the handler enqueued (``shardworker.core.followups``, JSON), then
(versions 5, 6, 8) a failed attempt's traceback, then (version 8) the outcome's extras (what a
suspended attempt waits on, the events the handler sent: ``shardworker.child.waits``, JSON)::

    u8 version (2, 4, 5, 6 or 8) | i64 job id | i32 attempt | u8 code | f64 retry delay
    | i32 result length (-1: none) | i32 error length (-1: none)
    | (versions 4 to 8) i32 follow-ups length (-1: none)
    | (versions 5 to 8) f64 failed at (Unix s; NaN: unknown) | i32 traceback length (-1: none)
    | (versions 6, 8) i64 job uid (0: unknown) | 16 bytes claim token (zeros: unknown)
    | (version 8) i32 extras length (-1: none)
    | result | error (UTF-8) | follow-ups | traceback (UTF-8) | extras

where code is the disposition (``_CODES``: 0 a failed attempt, retried after the delay, or for
good when the delay is -1; 1 done; 2 snoozed; 3 cancelled; 4, only in version 8, suspended):
an outcome with extras is version 8, which a release before it refuses (``NewerRecord``)
rather than mistakes for something else. A result is never escaped, decoded
or re-encoded on its way to PostgreSQL. A failed attempt with a traceback or a time is written
as version 5, any other outcome as version 4 with follow-ups and 2 without, as the release
before version 5 wrote them all (its outboxes still drain); an outcome that knows the claim it
ran under (``Outcome.uid`` and ``token``, which every outcome of a worker carries) is version 6,
so that it lands only on that claim and only on that job, even after the database went back
in time and handed the job's id to another job (``shardworker.flusher.marks``). No record is over
``outbox.MAX_RECORD_BYTES``: such an outcome is replaced by a failure that says so.

The step record (``encode_step``) is what ``job.step`` appends, with the outcomes, for the
same flusher (``decode_record`` tells them apart, ``step_key`` reads its header)::

    u8 version (3 or 7) | i64 job id | i32 attempt | f64 recorded at (Unix s)
    | i32 name length | i32 result length | (version 7) i64 job uid | name (UTF-8) | result (JSON, UTF-8)

The progress record (``encode_progress``) is what ``job.progress`` appends, throttled::

    u8 version (9) | i64 job id | i32 attempt | i64 job uid (0: unknown) | f64 reported at (Unix s)
    | value (JSON, UTF-8, to the record's end)

Version numbers are shared by every kind of record (the first byte tells them apart).
"""

from __future__ import annotations

import math
import struct
from dataclasses import replace

from outbox import MAX_RECORD_BYTES
from shardworker.core.model import Disposition, Outcome, ProgressRecord, StepRecord
from shardworker.errors import NewerRecord

JobKey = tuple[int, int]  # (job id, attempt)
CancelKey = tuple[int, int | None]  # a cancel's (job id, attempt); None: every attempt (an older release's cancel)

_RECORD = struct.Struct("<BqiBdii")
_RECORD_V2 = 2
_FOLLOWUPS = struct.Struct("<i")  # version 4: the follow-ups' length, after the header
_RECORD_V4 = 4
_FAILURE = struct.Struct("<idi")  # version 5: follow-ups length, failed at, traceback length
_RECORD_V5 = 5
_ORIGIN = struct.Struct("<q16s")  # version 6: the job's uid and the claim's token, after the failure fields
_RECORD_V6 = 6
_EXTRAS = struct.Struct("<i")  # version 8: the extras' length, after the origin
_RECORD_V8 = 8
_OUTCOME_VERSIONS = (_RECORD_V2, _RECORD_V4, _RECORD_V5, _RECORD_V6, _RECORD_V8)
_NO_TOKEN = bytes(16)
_CODES = {Disposition.RETRY: 0, Disposition.FAILED: 0, Disposition.DONE: 1, Disposition.SNOOZED: 2,
          Disposition.CANCELLED: 3, Disposition.SUSPENDED: 4}
_FOR_GOOD = -1.0  # the delay of a code-0 record that is not to be retried
_STEP = struct.Struct("<Bqidii")
_STEP_V3 = 3
_STEP_UID = struct.Struct("<q")  # version 7: the job's uid, after the lengths
_STEP_V7 = 7
_STEP_VERSIONS = (_STEP_V3, _STEP_V7)
_PROGRESS = struct.Struct("<Bqiqd")
_PROGRESS_V9 = 9
NEWEST_VERSION = _PROGRESS_V9  # a record above it was written by a newer release (NewerRecord)
_VERSIONS_END = 32  # first bytes from here on are not versions: the unreleased JSON format began with "["


def encode_outcome(outcome: Outcome) -> bytes:
    """The outbox record of ``outcome``; a too-large one becomes a final failure saying so."""
    result, followups, extras = outcome.result_json, outcome.followups_json, outcome.extras_json
    error, traceback = _utf8(outcome.error), _utf8(outcome.traceback)
    extended = extras is not None or outcome.disposition is Disposition.SUSPENDED
    origin = extended or outcome.uid is not None or outcome.token is not None
    failure = origin or traceback is not None or outcome.failed_at is not None
    extra = ((_FAILURE.size + (_ORIGIN.size if origin else 0) + (_EXTRAS.size if extended else 0)) if failure
             else _FOLLOWUPS.size if followups else 0)
    size = _RECORD.size + extra + sum(len(part or b"") for part in (result, error, followups, traceback, extras))
    if size > MAX_RECORD_BYTES:
        what = ("handler result and follow-up jobs" if followups else "handler result" if result is not None
                else "events sent" if extras is not None else "error and traceback")
        message = f"{what} too large: {size} bytes > {MAX_RECORD_BYTES}"
        outcome = replace(Outcome.failed(outcome.job_id, outcome.attempt, message), uid=outcome.uid, token=outcome.token)
        result, error, followups, traceback, extras, failure = None, message.encode(), None, None, None, origin
        extended = False
    delay = outcome.delay_s if outcome.disposition in (Disposition.RETRY, Disposition.SNOOZED) else _FOR_GOOD
    version = (_RECORD_V8 if extended else _RECORD_V6 if origin else _RECORD_V5 if failure
               else _RECORD_V4 if followups else _RECORD_V2)
    header = _RECORD.pack(version, outcome.job_id, outcome.attempt, _CODES[outcome.disposition], delay,
                          _length(result), _length(error))
    if failure:
        failed_at = math.nan if outcome.failed_at is None else outcome.failed_at
        header += _FAILURE.pack(_length(followups), failed_at, _length(traceback))
        if origin:
            header += _ORIGIN.pack(outcome.uid or 0, _token_bytes(outcome.token))
        if extended:
            header += _EXTRAS.pack(_length(extras))
    elif followups:
        header += _FOLLOWUPS.pack(len(followups))
    return b"".join((header, result or b"", error or b"", followups or b"", traceback or b"", extras or b""))


def decode_outcome(record: bytes) -> Outcome:
    """The outcome in an outbox record; ``ValueError`` when it is not one."""
    version, job_id, attempt, code, delay, result_len, error_len = _header(record)
    at = _RECORD.size
    followups_len, failed_at, traceback_len, uid, token, extras_len = -1, math.nan, -1, 0, _NO_TOKEN, -1
    tail = {_RECORD_V4: _FOLLOWUPS.size, _RECORD_V5: _FAILURE.size, _RECORD_V6: _FAILURE.size + _ORIGIN.size,
            _RECORD_V8: _FAILURE.size + _ORIGIN.size + _EXTRAS.size}.get(version)
    if tail is not None:
        if len(record) < at + tail:
            raise ValueError("not an outcome record: truncated header")
        if version == _RECORD_V4:
            (followups_len,) = _FOLLOWUPS.unpack_from(record, at)
        else:
            followups_len, failed_at, traceback_len = _FAILURE.unpack_from(record, at)
        if version in (_RECORD_V6, _RECORD_V8):
            uid, token = _ORIGIN.unpack_from(record, at + _FAILURE.size)
        if version == _RECORD_V8:
            (extras_len,) = _EXTRAS.unpack_from(record, at + _FAILURE.size + _ORIGIN.size)
        at += tail
    lengths = (result_len, error_len, followups_len, traceback_len, extras_len)
    if (code > (4 if version == _RECORD_V8 else 3) or min(lengths) < -1
            or at + sum(max(n, 0) for n in lengths) != len(record)):
        raise ValueError("not an outcome record: inconsistent header")
    result, error, followups, traceback, extras = _parts(record, at, lengths)
    disposition = (Disposition.FAILED if delay < 0 else Disposition.RETRY, Disposition.DONE, Disposition.SNOOZED,
                   Disposition.CANCELLED, Disposition.SUSPENDED)[code]
    kept = delay if disposition in (Disposition.RETRY, Disposition.SNOOZED) else 0.0
    return Outcome(job_id, attempt, disposition, result, None if error is None else error.decode("utf-8"), kept,
                   followups or None, None if traceback is None else traceback.decode("utf-8"),
                   None if math.isnan(failed_at) else failed_at, uid or None,
                   None if token == _NO_TOKEN else token.hex(), extras_json=extras)


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


def _token_bytes(token: str | None) -> bytes:
    """A claim token (32 hex digits, as the dispatcher makes them) as 16 bytes; zeros when
    there is none, or it is of another form (it is then not checked)."""
    try:
        raw = bytes.fromhex(token) if token else _NO_TOKEN
    except ValueError:
        return _NO_TOKEN
    return raw if len(raw) == 16 else _NO_TOKEN


def outcome_key(record: bytes) -> JobKey:
    """(job id, attempt) of an outbox record, read from its header alone."""
    _, job_id, attempt, *_ = _header(record)
    return job_id, attempt


def step_key(record: bytes) -> JobKey | None:
    """(job id, attempt) of a step record, read from its header alone; None for any other record."""
    if len(record) < _STEP.size or record[0] not in _STEP_VERSIONS:
        return None
    _, job_id, attempt, *_ = _STEP.unpack_from(record)
    return job_id, attempt


def encode_step(step: StepRecord) -> bytes:
    """The outbox record of a step's result (the caller keeps it within the result limit)."""
    name = step.name.encode("utf-8")
    version = _STEP_V3 if step.uid is None else _STEP_V7
    header = _STEP.pack(version, step.job_id, step.attempt, step.recorded_at, len(name), len(step.result_json))
    uid = b"" if step.uid is None else _STEP_UID.pack(step.uid)
    return b"".join((header, uid, name, step.result_json))


def encode_progress(progress: ProgressRecord) -> bytes:
    """The outbox record of a job's progress (the caller keeps the value small)."""
    return _PROGRESS.pack(_PROGRESS_V9, progress.job_id, progress.attempt, progress.uid or 0,
                          progress.reported_at) + progress.value_json


def decode_record(record: bytes) -> Outcome | StepRecord | ProgressRecord:
    """The outcome, the step or the progress in an outbox record; ``ValueError`` when it is none."""
    if record and record[0] == _PROGRESS_V9:
        if len(record) <= _PROGRESS.size:
            raise ValueError("not a progress record: truncated")
        _, job_id, attempt, uid, reported_at = _PROGRESS.unpack_from(record)
        return ProgressRecord(job_id, attempt, bytes(record[_PROGRESS.size:]), reported_at, uid or None)
    if step_key(record) is None:
        return decode_outcome(record)  # or ValueError: neither
    version, job_id, attempt, recorded_at, name_len, result_len = _STEP.unpack_from(record)
    start = _STEP.size + (_STEP_UID.size if version == _STEP_V7 else 0)
    if name_len < 1 or result_len < 1 or start + name_len + result_len != len(record):
        raise ValueError("not a step record: inconsistent header")
    uid = _STEP_UID.unpack_from(record, _STEP.size)[0] if version == _STEP_V7 else None
    at = start + name_len
    return StepRecord(job_id, attempt, bytes(record[start:at]).decode(), bytes(record[at:]), recorded_at, uid)


def _header(record: bytes) -> tuple[int, int, int, int, float, int, int]:
    if record and NEWEST_VERSION < record[0] < _VERSIONS_END:
        raise NewerRecord(f"record version {record[0]}; this release reads versions up to {NEWEST_VERSION}")
    if len(record) < _RECORD.size or record[0] not in _OUTCOME_VERSIONS:
        raise ValueError(f"not an outcome record: {bytes(record[:16])!r}")
    return _RECORD.unpack_from(record)
