"""What crosses a pipe or lands in the outbox, encoded in one place.

Pipe messages between the parent and a child are frozen dataclasses; ``encode`` and
``decode`` turn them into orjson bytes and back::

    parent -> child   Jobs(jobs, slots)    Recall()    Stop()
    child -> parent   Done(finished, stats)    Returned(jobs)    Stopped(unstarted)    Fatal(message)

``Jobs`` gives each job the progress slot the child marks when it starts it; ``Done`` names
jobs whose outcomes are durable, by (id, attempt), with counts for the metrics
(``shardworker.jobstats.summarize``); ``Recall`` asks a child for the jobs not started, and
``Returned`` names them (never to start there: the parent may send them elsewhere);
``Stopped`` lists those a stopping child never started; ``Fatal`` is a child's last error.

On the pipe each message is a frame: a 4-byte big-endian length, then the bytes. ``OutFrames``
queues frames on a non-blocking descriptor (the parent never waits on a child that does not
read), ``InFrames`` takes them as they arrive, ``read_frame``/``write_frame`` are the child's side.

The outcome record (``encode_outcome`` / ``decode_outcome``) is what a child or the
parent appends to the outbox and the flusher applies: a fixed header, then the result's
JSON bytes exactly as the child encoded them, then the error text::

    u8 version (2) | i64 job id | i32 attempt | u8 code | f64 retry delay
    | i32 result length (-1: none) | i32 error length (-1: none) | result | error (UTF-8)

where code is the disposition (``_CODES``: 0 a failed attempt, retried after the delay, or for
good when the delay is -1; 1 done; 2 snoozed; 3 cancelled): a result is never escaped, decoded
or re-encoded on its way to PostgreSQL. No record is over ``outbox.MAX_RECORD_BYTES``: such an
outcome is replaced by a failure that says so.

The step record (``encode_step``) is what ``job.step`` appends, with the outcomes, for the
same flusher (``decode_record`` tells them apart, ``step_key`` reads its header)::

    u8 version (3) | i64 job id | i32 attempt | f64 recorded at (Unix s)
    | i32 name length | i32 result length | name (UTF-8) | result (JSON, UTF-8)
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import orjson

from outbox import MAX_RECORD_BYTES
from shardworker.model import ClaimedJob, Disposition, Outcome, StepRecord

JobKey = tuple[int, int]  # (job id, attempt)


@dataclass(frozen=True, slots=True)
class Jobs:
    jobs: tuple[ClaimedJob, ...]
    slots: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Stop:
    pass


@dataclass(frozen=True, slots=True)
class Recall:
    pass


@dataclass(frozen=True, slots=True)
class Done:
    finished: tuple[JobKey, ...]
    stats: dict[str, list[float]] | None = None  # the commit's outcomes by kind (metrics.summarize)


@dataclass(frozen=True, slots=True)
class Returned:
    jobs: tuple[JobKey, ...]


@dataclass(frozen=True, slots=True)
class Stopped:
    unstarted: tuple[JobKey, ...]


@dataclass(frozen=True, slots=True)
class Fatal:
    message: str


Message = Jobs | Recall | Stop | Done | Returned | Stopped | Fatal


def encode(msg: Message) -> bytes:
    """The bytes of one pipe message."""
    if isinstance(msg, Jobs):
        return orjson.dumps(["jobs", [[j.id, j.kind, j.queue, j.payload_json, j.attempt, j.max_attempts, slot,
                                       j.steps_json] for j, slot in zip(msg.jobs, msg.slots, strict=True)]])
    if isinstance(msg, Done):
        return orjson.dumps(["done", msg.finished, msg.stats])
    if isinstance(msg, Returned):
        return orjson.dumps(["returned", msg.jobs])
    if isinstance(msg, Stopped):
        return orjson.dumps(["stopped", msg.unstarted])
    if isinstance(msg, Recall):
        return b'["recall"]'
    if isinstance(msg, Fatal):
        return orjson.dumps(["fatal", msg.message])
    return b'["stop"]'


def decode(data: bytes) -> Message:
    """The message in ``data``; ``ValueError`` for anything else."""
    value = orjson.loads(data)
    tag, body = value[0], value[1] if len(value) > 1 else ()
    if tag == "jobs":
        jobs = tuple(ClaimedJob(j[0], j[1], j[2], j[3], j[4], j[5], j[7]) for j in body)
        return Jobs(jobs, tuple(int(j[6]) for j in body))
    if tag == "done":
        return Done(tuple((int(i), int(a)) for i, a in body), value[2] if len(value) > 2 else None)
    if tag == "stopped":
        return Stopped(tuple((int(i), int(a)) for i, a in body))
    if tag == "returned":
        return Returned(tuple((int(i), int(a)) for i, a in body))
    if tag == "recall":
        return Recall()
    if tag == "fatal":
        return Fatal(str(body))
    if tag == "stop":
        return Stop()
    raise ValueError(f"unknown pipe message {tag!r}")


_RECORD = struct.Struct("<BqiBdii")
_RECORD_V2 = 2
_CODES = {Disposition.RETRY: 0, Disposition.FAILED: 0, Disposition.DONE: 1, Disposition.SNOOZED: 2,
          Disposition.CANCELLED: 3}
_FOR_GOOD = -1.0  # the delay of a code-0 record that is not to be retried
_STEP = struct.Struct("<Bqidii")
_STEP_V3 = 3


def encode_outcome(outcome: Outcome) -> bytes:
    """The outbox record of ``outcome``; a too-large one becomes a final failure saying so."""
    result = outcome.result_json
    error = None if outcome.error is None else outcome.error.encode("utf-8", "backslashreplace")
    size = _RECORD.size + len(result or b"") + len(error or b"")
    if size > MAX_RECORD_BYTES:
        message = f"handler result too large: {size} bytes > {MAX_RECORD_BYTES}"
        outcome = Outcome.failed(outcome.job_id, outcome.attempt, message)
        result, error = None, message.encode()
    delay = outcome.delay_s if outcome.disposition in (Disposition.RETRY, Disposition.SNOOZED) else _FOR_GOOD
    header = _RECORD.pack(_RECORD_V2, outcome.job_id, outcome.attempt, _CODES[outcome.disposition], delay,
                          -1 if result is None else len(result), -1 if error is None else len(error))
    return b"".join((header, result or b"", error or b""))


def decode_outcome(record: bytes) -> Outcome:
    """The outcome in an outbox record; ``ValueError`` when it is not one."""
    _, job_id, attempt, code, delay, result_len, error_len = _header(record)
    if code > 3 or result_len < -1 or error_len < -1 or (
            _RECORD.size + max(result_len, 0) + max(error_len, 0) != len(record)):
        raise ValueError("not an outcome record: inconsistent header")
    at = _RECORD.size
    result = None if result_len < 0 else bytes(record[at:at + result_len])
    at += max(result_len, 0)
    error = None if error_len < 0 else bytes(record[at:at + error_len]).decode("utf-8")
    disposition = (Disposition.FAILED if delay < 0 else Disposition.RETRY, Disposition.DONE, Disposition.SNOOZED,
                   Disposition.CANCELLED)[code]
    kept = delay if disposition in (Disposition.RETRY, Disposition.SNOOZED) else 0.0
    return Outcome(job_id, attempt, disposition, result, error, kept)


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
    if len(record) < _RECORD.size or record[0] != _RECORD_V2:
        raise ValueError(f"not an outcome record: {bytes(record[:16])!r}")
    return _RECORD.unpack_from(record)


# --- frames on a pipe ---------------------------------------------------------------------

_LENGTH = struct.Struct("!I")


class OutFrames:
    """Frames queued for a non-blocking descriptor; ``flush`` writes what the pipe takes now."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self._buffer = bytearray()

    def put(self, msg: Message) -> None:
        data = encode(msg)
        self._buffer += _LENGTH.pack(len(data))
        self._buffer += data
        self.flush()

    @property
    def queued_bytes(self) -> int:
        return len(self._buffer)

    def flush(self) -> None:
        """Write as much as the pipe accepts without blocking; ``OSError`` if the reader is gone."""
        while self._buffer:
            try:
                written = os.write(self.fd, self._buffer)
            except BlockingIOError:
                return
            del self._buffer[:written]


class InFrames:
    """Messages read from a non-blocking descriptor as whole frames arrive."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self._buffer = bytearray()
        self.closed = False  # the writer is gone

    def read(self) -> list[Message]:
        """Every complete message available now."""
        while not self.closed:
            try:
                chunk = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                break
            if not chunk:
                self.closed = True
            self._buffer += chunk
        messages = []
        while len(self._buffer) >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(self._buffer)
            if len(self._buffer) < _LENGTH.size + size:
                break
            messages.append(decode(bytes(self._buffer[_LENGTH.size:_LENGTH.size + size])))
            del self._buffer[:_LENGTH.size + size]
        return messages


def write_frame(fd: int, msg: Message) -> None:
    """Write one message to a blocking descriptor (callers serialize writers)."""
    data = encode(msg)
    view = memoryview(_LENGTH.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def read_frame(fd: int) -> Message | None:
    """The next message from a blocking descriptor; None at end of file."""
    header = _read_exact(fd, _LENGTH.size)
    if header is None:
        return None
    (size,) = _LENGTH.unpack(header)
    data = _read_exact(fd, size)
    if data is None:
        return None
    return decode(data)


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
