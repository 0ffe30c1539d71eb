"""Follow-up jobs and dependencies, before they reach the database.

``job.enqueue(...)`` in a handler does not touch PostgreSQL (a child holds no connection): it
validates the job as ``enqueue`` would and adds it to the run's ``FollowUps``, which travel
inside the job's outcome record. The flusher inserts them in the transaction that applies
that outcome, and only if it applies as done, so they exist exactly when their parent is
done, once, through outages, restarts and drains (``shardworker.store.dependencies``).

``after=`` names what a job waits on: ids of jobs that exist, or (in a handler) the handles
of follow-ups enqueued earlier in the same run. Either way every edge points to an older
job, so no cycle can ever form. Encoded, a reference to an earlier follow-up is negative:
``-(its index + 1)``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from shardworker.errors import EnqueueError

MAX_FOLLOWUPS = 100_000  # follow-up jobs one run may enqueue
MAX_FOLLOWUP_BYTES = 32 * 1024 * 1024  # and their encoded size (an outbox record holds at most 64 MiB)
MAX_AFTER = 100_000  # jobs one job may wait on


@dataclass(frozen=True, slots=True)
class FollowUp:
    """A job a handler enqueued (``job.enqueue``): it is inserted when the handler's job is
    applied as done. Pass it in ``after=`` of a later ``job.enqueue`` of the same run."""

    index: int  # its place among the run's follow-ups
    kind: str
    run: object = field(repr=False, compare=False)  # the FollowUps that made it


class DependentRow(NamedTuple):
    """A job to insert that may wait on others: ``after`` holds job ids, and references
    ``-(i + 1)`` to the i-th row of the same batch. ``id`` and ``uid``: what to insert it
    with (None: drawn as usual): a follow-up's uid follows from its parent's run
    (``followup_uid``), and one inserted again after the database went back in time keeps the
    id it had (``shardworker.flusher.journal``)."""

    kind: str
    queue: str
    payload_json: str
    priority: int
    max_attempts: int
    run_at: Any  # a datetime in UTC, or None: now
    delay_s: float
    dedupe_key: str | None
    after: tuple[int, ...]
    id: int | None = None
    uid: int | None = None
    reinserted: bool = False  # inserted again after the database went back in time: findable by uid
    key: str | None = None  # whose job it is (a tenant's): JobSpec.key
    tags: tuple[str, ...] = ()  # JobSpec.tags
    trace: str | None = None  # the trace its runs continue (jobs.trace as JSON text: shardworker.core.tracing)


def followup_uid(parent_uid: int, attempt: int, index: int) -> int:
    """The uid of the ``index``-th follow-up of a run (its parent's uid and attempt): the same
    whenever that run's outcome is applied, so its outcome, kept elsewhere, finds it again."""
    digest = hashlib.blake2b(f"{parent_uid}:{attempt}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1  # a positive bigint

def check_after(after: Iterable[Any] | None) -> tuple[int, ...]:
    """``after=`` given job ids, as a tuple without repeats; ``EnqueueError`` otherwise."""
    if after is None:
        return ()
    if isinstance(after, str | bytes) or not isinstance(after, Iterable):
        raise EnqueueError(f"after must be a list of job ids, got {type(after).__name__}")
    ids: dict[int, None] = {}
    for ref in after:
        if isinstance(ref, FollowUp):
            raise EnqueueError(f"after: {ref!r} is a follow-up handle, which only job.enqueue in the same run takes")
        if not isinstance(ref, int) or isinstance(ref, bool) or not 1 <= ref < 2**63:
            raise EnqueueError(f"after: {ref!r} is not a job id")
        ids[ref] = None
    if len(ids) > MAX_AFTER:
        raise EnqueueError(f"after: {len(ids)} jobs, the limit is {MAX_AFTER}")
    return tuple(ids)


def decode(blob: bytes) -> list[DependentRow]:
    """The follow-ups an outcome record carries (``FollowUps.encode``)."""
    # A key is the ninth field, tags the tenth and the trace the eleventh, when there are
    # (records of releases before keys have eight fields, before tags nine, before traces ten).
    return [DependentRow(kind, queue, payload, priority, max_attempts, None, float(delay), dedupe_key, tuple(refs),
                         key=rest[0] if rest else None, tags=tuple(rest[1]) if len(rest) > 1 else (),
                         trace=rest[2] if len(rest) > 2 else None)
            for kind, payload, queue, priority, max_attempts, delay, dedupe_key, refs, *rest in orjson.loads(blob)]
