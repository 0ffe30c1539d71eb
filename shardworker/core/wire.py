"""What crosses a pipe or lands in the outbox, encoded in one place.

Pipe messages between the parent and a child are frozen dataclasses; ``encode`` and
``decode`` turn them into orjson bytes and back::

    parent -> child   Jobs(jobs, slots)    Recall()    CancelJobs(jobs)    Stop()
    child -> parent   Done(finished, stats)    Returned(jobs)    Stopped(unstarted)    Fatal(message)

``Jobs`` gives each job the progress slot the child marks when it starts it; ``Done`` names
jobs whose outcomes are durable, by (id, attempt), with counts for the metrics
(``shardworker.core.jobstats.summarize``); ``Recall`` asks a child for the jobs not started, and
``Returned`` names them (never to start there: the parent may send them elsewhere);
``CancelJobs`` names jobs an operator cancelled while the child holds them (never started,
or stopped if running);
``Stopped`` lists those a stopping child never started; ``Fatal`` is a child's last error
(``at_start``: a startup hook's, before it took any job).

On the pipe each message is a frame: a 4-byte big-endian length, then the bytes. ``OutFrames``
queues frames on a non-blocking descriptor (the parent never waits on a child that does not
read), ``InFrames`` takes them as they arrive, ``read_frame``/``write_frame`` are the child's side.

The outbox records (outcomes and steps) are encoded in ``shardworker.core.records``, re-exported here.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import orjson

from shardworker.core.model import ClaimedJob
from shardworker.core.records import (  # noqa: F401 (re-exported: the records are part of the wire)
    CancelKey,
    JobKey,
    decode_outcome,
    decode_record,
    encode_outcome,
    encode_step,
    outcome_key,
    step_key,
)


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
class CancelJobs:
    """An operator cancelled these jobs while the child holds them: stop or never start them."""

    jobs: tuple[JobKey, ...]


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
    at_start: bool = False  # a startup hook raised: the child never took a job, and will not


Message = Jobs | Recall | CancelJobs | Stop | Done | Returned | Stopped | Fatal


def encode(msg: Message) -> bytes:
    """The bytes of one pipe message."""
    if isinstance(msg, Jobs):
        return orjson.dumps(["jobs", [[j.id, j.kind, j.queue, j.payload_json, j.attempt, j.max_attempts, slot,
                                       j.steps_json, j.dependencies_json, j.snoozes, j.uid, j.token, j.withheld,
                                       j.key, j.trace_json]
                                      for j, slot in zip(msg.jobs, msg.slots, strict=True)]])
    if isinstance(msg, Done):
        return orjson.dumps(["done", msg.finished, msg.stats])
    if isinstance(msg, Returned):
        return orjson.dumps(["returned", msg.jobs])
    if isinstance(msg, Stopped):
        return orjson.dumps(["stopped", msg.unstarted])
    if isinstance(msg, Recall):
        return b'["recall"]'
    if isinstance(msg, CancelJobs):
        return orjson.dumps(["cancel", msg.jobs])
    if isinstance(msg, Fatal):
        return orjson.dumps(["fatal", msg.message, msg.at_start])
    return b'["stop"]'


def decode(data: bytes) -> Message:
    """The message in ``data``; ``ValueError`` for anything else."""
    value = orjson.loads(data)
    tag, body = value[0], value[1] if len(value) > 1 else ()
    if tag == "jobs":
        jobs = tuple(ClaimedJob(j[0], j[1], j[2], j[3], j[4], j[5], j[7], j[8], j[9], j[10], j[11],
                                None if j[12] is None else (int(j[12][0]), int(j[12][1])), j[13], j[14])
                     for j in body)
        return Jobs(jobs, tuple(int(j[6]) for j in body))
    if tag == "done":
        return Done(tuple((int(i), int(a)) for i, a in body), value[2] if len(value) > 2 else None)
    if tag == "stopped":
        return Stopped(tuple((int(i), int(a)) for i, a in body))
    if tag == "returned":
        return Returned(tuple((int(i), int(a)) for i, a in body))
    if tag == "recall":
        return Recall()
    if tag == "cancel":
        return CancelJobs(tuple((int(i), int(a)) for i, a in body))
    if tag == "fatal":
        return Fatal(str(body), bool(value[2]) if len(value) > 2 else False)
    if tag == "stop":
        return Stop()
    raise ValueError(f"unknown pipe message {tag!r}")


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
