"""What crosses a pipe or lands in the outbox, encoded in one place.

Pipe messages between the parent and a child are frozen dataclasses; ``encode`` and
``decode`` turn them into orjson bytes and back::

    parent -> child   Jobs(jobs)        Stop()
    child -> parent   Done(finished)    Stopped(unstarted)    Fatal(message)

``Done`` names jobs whose outcomes are durable, by (id, attempt); ``Stopped`` lists the
jobs a stopping child never started; ``Fatal`` is the last error of a child that cannot
go on (its app does not load, its outbox fails).

The outcome record (``encode_outcome`` / ``decode_outcome``) is what a child or the
parent appends to the outbox and the flusher applies. It is never over
``outbox.MAX_RECORD_BYTES``: an outcome that would be is replaced by a failure that says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from outbox import MAX_RECORD_BYTES
from shardworker.model import ClaimedJob, Outcome

JobKey = tuple[int, int]  # (job id, attempt)


@dataclass(frozen=True, slots=True)
class Jobs:
    jobs: tuple[ClaimedJob, ...]


@dataclass(frozen=True, slots=True)
class Stop:
    pass


@dataclass(frozen=True, slots=True)
class Done:
    finished: tuple[JobKey, ...]


@dataclass(frozen=True, slots=True)
class Stopped:
    unstarted: tuple[JobKey, ...]


@dataclass(frozen=True, slots=True)
class Fatal:
    message: str


Message = Jobs | Stop | Done | Stopped | Fatal


def encode(msg: Message) -> bytes:
    """The bytes of one pipe message."""
    if isinstance(msg, Jobs):
        return orjson.dumps(["jobs", [[j.id, j.kind, j.queue, j.payload_json, j.attempt, j.max_attempts]
                                      for j in msg.jobs]])
    if isinstance(msg, Done):
        return orjson.dumps(["done", msg.finished])
    if isinstance(msg, Stopped):
        return orjson.dumps(["stopped", msg.unstarted])
    if isinstance(msg, Fatal):
        return orjson.dumps(["fatal", msg.message])
    return b'["stop"]'


def decode(data: bytes) -> Message:
    """The message in ``data``; ``ValueError`` for anything else."""
    value = orjson.loads(data)
    tag, body = value[0], value[1] if len(value) > 1 else ()
    if tag == "jobs":
        return Jobs(tuple(ClaimedJob(*j) for j in body))
    if tag == "done":
        return Done(tuple((int(i), int(a)) for i, a in body))
    if tag == "stopped":
        return Stopped(tuple((int(i), int(a)) for i, a in body))
    if tag == "fatal":
        return Fatal(str(body))
    if tag == "stop":
        return Stop()
    raise ValueError(f"unknown pipe message {tag!r}")


def encode_outcome(outcome: Outcome) -> bytes:
    """The outbox record of ``outcome``; a too-large one becomes a final failure saying so."""
    record = orjson.dumps(_to_wire(outcome))
    if len(record) <= MAX_RECORD_BYTES:
        return record
    too_big = Outcome(outcome.job_id, outcome.attempt, False, retry_delay_s=-1.0,
                      error=f"handler result too large: {len(record)} bytes > {MAX_RECORD_BYTES}")
    return orjson.dumps(_to_wire(too_big))


def decode_outcome(record: bytes) -> Outcome:
    """The outcome in an outbox record; ``ValueError`` when it is not one."""
    value = orjson.loads(record)
    if not (isinstance(value, list) and len(value) == 6):
        raise ValueError(f"not an outcome record: {value!r:.80}")
    job_id, attempt, ok, result_json, error, delay = value
    if not isinstance(ok, bool):
        raise ValueError(f"not an outcome record: ok is {ok!r}")
    return Outcome(int(job_id), int(attempt), ok, result_json, error, float(delay))


def _to_wire(outcome: Outcome) -> list[Any]:
    return [outcome.job_id, outcome.attempt, outcome.ok, outcome.result_json, outcome.error, outcome.retry_delay_s]
