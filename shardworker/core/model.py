"""Domain values that cross process boundaries: plain, frozen, picklable.

``Job`` is what a handler receives. ``Outcome`` is what a child writes to its outbox and
the flusher applies (its record form lives in ``shardworker.core.wire``), ``StepRecord`` what
``job.step`` records. What the store reads back for operators is in ``shardworker.core.views``.
"""

from __future__ import annotations

import enum
import json
import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import orjson

from shardworker.core.limits import DEFAULT_MAX_ATTEMPTS

# orjson reads an integer beyond 64 bits as a float. |i| < 10**18 fits whatever reads it, so
# only JSON text with a run of 19 digits is read again, exactly, by the standard library.
_LONG_DIGITS = re.compile(r"\d{19}")


def loads_exact(text: str) -> Any:
    """JSON text as Python values with every integer exact (rows written by other means than
    shardworker's enqueue may hold integers beyond 64 bits)."""
    value = orjson.loads(text)
    if _LONG_DIGITS.search(text):
        return json.loads(text)
    return value


def dumps_exact(value: Any) -> bytes:
    """``value`` as JSON in UTF-8 bytes: orjson's, or the standard library's when an integer is
    beyond 64 bits (orjson cannot write one; PostgreSQL's jsonb stores it exactly). Raises
    ``orjson.JSONEncodeError`` for anything else neither can encode."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        if "64-bit" not in str(exc):
            raise
        try:
            return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
        except (TypeError, ValueError):
            raise exc from None


def has_non_finite(value: Any) -> bool:
    """Whether ``value`` holds a float that is nan or infinite (orjson writes them as null)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(has_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(has_non_finite(v) for v in value)
    return False


@dataclass(frozen=True, slots=True)
class Job:
    """A claimed job, as the handler sees it.

    ``attempt`` counts its runs (1 on the first), ``snoozes`` those that used no attempt
    (``Snooze``), so ``attempt - snoozes`` of its ``max_attempts`` are used, this run included.

    ``job.step(name, fn, *args, **kwargs)`` runs ``fn(*args, **kwargs)`` once for this job,
    ever: its result is recorded in the outbox (and later in ``shardworker.job_steps``)
    before the call returns, and any later attempt gets the recorded result back without
    calling ``fn``. In an ``async def`` handler, await it (``fn`` may be a coroutine
    function). See ``shardworker.child.steps``.
    """

    id: int
    kind: str
    queue: str
    payload: Any
    attempt: int
    max_attempts: int
    _steps: Any = field(default=None, repr=False, compare=False)
    # {job id: result} of the jobs this one waited on (after=); empty when it waited on none.
    dependencies: dict[int, Any] = field(default_factory=dict, repr=False, compare=False)
    _followups: Any = field(default=None, repr=False, compare=False)  # shardworker.core.followups.FollowUps
    # Runs of this job that used no attempt (snoozed): attempts used are attempt - snoozes.
    snoozes: int = 0
    _cancel: Any = field(default=None, repr=False, compare=False)  # a cancels.Flag an operator's cancel sets
    key: str | None = None  # whose job it is (enqueue's key=): a tenant's, an account's; None: no one's
    _waits: Any = field(default=None, repr=False, compare=False)  # shardworker.child.waits.Waits

    @property
    def cancelled(self) -> bool:
        """Whether an operator cancelled this job while it runs (``shardworker jobs cancel``).
        A cheap check to poll in a long sync or threaded handler: return (or raise) soon
        after it turns True; past the worker's ``--cancel-grace`` the child is stopped. An
        ``async def`` handler is cancelled at its next ``await`` instead."""
        return self._cancel is not None and self._cancel.is_set()

    def step(self, name: str, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``'s result, computed once for this job whatever attempt asks."""
        if self._steps is None:
            raise RuntimeError("job.step works inside a worker's handler only (this Job was made by hand)")
        return self._steps.run(name, fn, args, kwargs)

    def sleep(self, name: str, seconds: float) -> Any:
        """A durable timer: the job gives up its worker now (the attempt ends uncharged, as a
        snooze) and runs again once ``seconds`` have passed; that run replays the steps before
        this line from their records, and ``sleep`` returns at once. ``name`` is a step's name
        (unique within the job). In an ``async def`` handler, await it. See ``shardworker.child.waits``."""
        return self._waiting("job.sleep").sleep(name, seconds)

    def wait_event(self, name: str, key: str, timeout_s: float | None = None) -> Any:
        """The payload of the event sent to ``key`` (``shardworker.send_event``, ``job.send_event``,
        ``shardworker events send``): the job waits for it without holding a worker, and runs
        again once it comes (one sent since the job was enqueued counts, even before this wait).
        Recorded as step ``name``, so every later run gets the same payload. Past ``timeout_s``
        (None: no limit) it raises ``shardworker.EventTimeout``. In an ``async def`` handler, await it."""
        return self._waiting("job.wait_event").wait_event(name, key, timeout_s)

    def send_event(self, key: str, payload: Any = None) -> Any:
        """Send an event to ``key`` with this run's outcome: it lands in the transaction that
        applies the outcome when the run ends done, snoozed or waiting (not when it fails:
        its retry sends it), once, even when a later run of the job sends it again. Nothing to
        wait for (in an ``async def`` handler, awaiting it is allowed and returns at once)."""
        return self._waiting("job.send_event").send_event(key, payload)

    def progress(self, value: Any) -> Any:
        """Report how far the job got (a small JSON value: a fraction, a message, a count):
        shown by ``jobs show``, ``jobs list``, the dashboard and ``wait_for(on_progress=)``.
        Cheap: it goes through the outbox with the next commit, a record at most every 0.25 s
        a job (the last value always lands), never a database write from the handler. A value
        that cannot be shown (not JSON, over 8 KiB) is dropped with a warning: a status report
        never fails its job. Awaiting it is allowed, as for ``send_event``."""
        return self._waiting("job.progress").progress(value)

    def _waiting(self, what: str) -> Any:
        if self._waits is None:
            raise RuntimeError(f"{what} works inside a worker's handler only (this Job was made by hand)")
        return self._waits

    def enqueue(self, kind: str, payload: Any = None, *, queue: str = "default", priority: int = 0,
                delay_s: float = 0.0, max_attempts: int = DEFAULT_MAX_ATTEMPTS, dedupe_key: str | None = None,
                after: Any = (), key: str | None = None, tags: Any = ()) -> Any:
        """Enqueue a follow-up job, inserted only if this job's outcome is applied as done, in
        the same transaction, exactly once (``shardworker.core.followups``); returns its handle, which
        ``after=`` of a later ``job.enqueue`` takes, as it takes job ids. ``key`` and ``tags`` as ``enqueue``'s."""
        if self._followups is None:
            raise RuntimeError("job.enqueue works inside a worker's handler only (this Job was made by hand)")
        return self._followups.add(kind, payload, queue=queue, priority=priority, delay_s=delay_s,
                                   max_attempts=max_attempts, dedupe_key=dedupe_key, after=after, key=key, tags=tags)


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A claimed job on its way to a child: the payload stays JSON text until the child, and
    so do the results of the steps earlier attempts recorded (``steps_json``, a JSON object
    of step name to result; None when the job has none: read only for an attempt after the
    first)."""

    id: int
    kind: str
    queue: str
    payload_json: str
    attempt: int
    max_attempts: int
    steps_json: str | None = None
    dependencies_json: str | None = None  # {id: result} of the jobs it waited on; None: none
    snoozes: int = 0  # runs that used no attempt
    # Which job and which claim this is: the row's uid (None: a row from before migration 0015)
    # and the claim's token. Its outcome and steps carry both (``Outcome.claimed_by``), so they
    # land on this claim of this job only (``shardworker.flusher.marks``).
    uid: int | None = None
    token: str | None = None
    # Over MAX_JOB_INPUT_BYTES: the sizes, as JSON text, of the recorded steps and of the
    # dependencies' results the claim did not bring (steps_json and dependencies_json are
    # None); the child fails the job for good, naming them. None: nothing was left behind.
    withheld: tuple[int, int] | None = None
    key: str | None = None  # the job's key (enqueue's key=)
    # The job's trace (jobs.trace, JSON text; None: its enqueue traced nothing): the context its
    # runs continue and the runs of earlier attempts they link to (shardworker.core.tracing).
    trace_json: str | None = None

    @property
    def attempts_used(self) -> int:
        """Attempts used, this run included (``attempt - snoozes``): what ``max_attempts`` limits."""
        return self.attempt - self.snoozes

    @property
    def size(self) -> int:
        """What it holds in memory and on a pipe, near enough: its JSON texts' lengths."""
        return len(self.payload_json) + len(self.steps_json or "") + len(self.dependencies_json or "")

    def to_job(self, steps: Any = None, followups: Any = None, cancel: Any = None, waits: Any = None) -> Job:
        """The handler's view; ``steps`` runs its ``job.step`` calls (``shardworker.child.steps``),
        ``followups`` keeps its ``job.enqueue`` calls (``shardworker.core.followups``), ``cancel``
        (its ``cancels.Flag``) tells ``job.cancelled``, ``waits`` its sleeps, events and
        progress (``shardworker.child.waits``)."""
        dependencies = {} if self.dependencies_json is None else {
            int(key): value for key, value in loads_exact(self.dependencies_json).items()}
        return Job(self.id, self.kind, self.queue, loads_exact(self.payload_json), self.attempt,
                   self.max_attempts, steps, dependencies, followups, self.snoozes, cancel, self.key, waits)


class Claim(NamedTuple):
    """What a claim took, and ``pace_s``: when it took jobs of a rate-limited kind or queue,
    how soon its bucket holds a burst again (the next claim is worth making then)."""

    jobs: list[ClaimedJob]
    pace_s: float | None


class Disposition(enum.Enum):
    """What an attempt asks of its job. The delay goes with ``RETRY`` (seconds until the
    next attempt, while attempts remain: the job row decides) and ``SNOOZED`` (seconds until
    it runs again, no attempt used)."""

    DONE = "done"
    RETRY = "retry"
    FAILED = "failed"  # for good, whatever attempts remain
    SNOOZED = "snoozed"
    CANCELLED = "cancelled"
    # The handler waits (job.sleep, job.wait_event): the job waits in its row, no attempt used,
    # until its time comes or its event is sent (Outcome.extras_json says which).
    SUSPENDED = "suspended"


@dataclass(frozen=True, slots=True)
class Outcome:
    """The result of one attempt: its disposition, the result of a ``DONE`` (the handler's
    return value as JSON text in UTF-8 bytes, carried as the child encoded it), the error
    of a ``RETRY``, ``FAILED`` or ``CANCELLED``, and the delay of a ``RETRY`` or ``SNOOZED``.
    A failed attempt (``RETRY``, ``FAILED``) may carry its traceback (apart from the error
    message, bounded by the child) and when it failed (Unix seconds, the child's clock):
    the job's ``errors`` history keeps both. Build one with ``done``, ``retry``,
    ``failed``, ``snoozed`` or ``cancelled``."""

    job_id: int
    attempt: int
    disposition: Disposition
    result_json: bytes | None = None
    error: str | None = None
    delay_s: float = 0.0
    followups_json: bytes | None = None  # a done attempt's follow-up jobs (shardworker.core.followups)
    traceback: str | None = None  # a failed attempt's traceback
    failed_at: float | None = None  # when a failed attempt failed (Unix s); None: when it is applied
    uid: int | None = None  # the job's uid and the claim's token it ran under (ClaimedJob); None: not checked
    token: str | None = None
    # Applied again after the database went back in time (never in the record): its follow-ups
    # are inserted again, marked (an outcome of theirs kept elsewhere finds them by uid), with the
    # ids they had when known (shardworker.flusher.journal), and wait followup_wait_s before they
    # may be claimed (an outcome of theirs kept on another host lands meanwhile).
    reapplied: bool = False
    followup_ids: tuple[int | None, ...] | None = None
    followup_wait_s: float = 0.0
    # What else lands with the outcome, as a JSON object (shardworker.child.waits): "wait", what a
    # SUSPENDED attempt waits on; "events", the events the handler sent (job.send_event).
    extras_json: bytes | None = None

    def claimed_by(self, job: ClaimedJob) -> Outcome:
        """This outcome, marked as the outcome of ``job``'s claim (its uid and token)."""
        if (self.uid, self.token) == (job.uid, job.token):
            return self
        return replace(self, uid=job.uid, token=job.token)

    @classmethod
    def done(cls, job_id: int, attempt: int, result_json: bytes, followups_json: bytes | None = None) -> Outcome:
        return cls(job_id, attempt, Disposition.DONE, result_json=result_json, followups_json=followups_json)

    @classmethod
    def retry(cls, job_id: int, attempt: int, error: str | None, delay_s: float, *, traceback: str | None = None,
              failed_at: float | None = None) -> Outcome:
        return cls(job_id, attempt, Disposition.RETRY, error=error, delay_s=delay_s, traceback=traceback,
                   failed_at=failed_at)

    @classmethod
    def failed(cls, job_id: int, attempt: int, error: str | None, *, traceback: str | None = None,
               failed_at: float | None = None) -> Outcome:
        return cls(job_id, attempt, Disposition.FAILED, error=error, traceback=traceback, failed_at=failed_at)

    @classmethod
    def after_failure(cls, job_id: int, attempt: int, error: str | None, delay_s: float | None, *,
                      traceback: str | None = None, failed_at: float | None = None) -> Outcome:
        """A failed attempt: retried after ``delay_s``, or failed for good when it is None."""
        if delay_s is None:
            return cls.failed(job_id, attempt, error, traceback=traceback, failed_at=failed_at)
        return cls.retry(job_id, attempt, error, delay_s, traceback=traceback, failed_at=failed_at)

    @classmethod
    def snoozed(cls, job_id: int, attempt: int, delay_s: float) -> Outcome:
        return cls(job_id, attempt, Disposition.SNOOZED, delay_s=delay_s)

    @classmethod
    def cancelled(cls, job_id: int, attempt: int, error: str | None) -> Outcome:
        return cls(job_id, attempt, Disposition.CANCELLED, error=error)

    @classmethod
    def suspended(cls, job_id: int, attempt: int, extras_json: bytes) -> Outcome:
        return cls(job_id, attempt, Disposition.SUSPENDED, extras_json=extras_json)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """A step's result as a child recorded it: the result's JSON text in UTF-8 bytes, as
    encoded, and when it was recorded (Unix seconds, the child's clock). Its outbox form is
    in ``shardworker.core.wire``."""

    job_id: int
    attempt: int
    name: str
    result_json: bytes
    recorded_at: float
    uid: int | None = None  # the job's uid (ClaimedJob.uid); None: not checked


@dataclass(frozen=True, slots=True)
class ProgressRecord:
    """How far a running job got, as its handler reported it (``job.progress``): a small JSON
    value in UTF-8 bytes, and when (Unix seconds, the child's clock). Only the attempt that
    reported it shows it (``shardworker.store.worker_queries``)."""

    job_id: int
    attempt: int
    value_json: bytes
    reported_at: float
    uid: int | None = None


@dataclass(frozen=True, slots=True)
class Mark:
    """How far an outbox's flusher has applied, written in the transaction of a batch
    (``shardworker.outbox_marks``): the outbox, its worker, the count of batches applied, and
    per shard (of those the batch read) the outbox position after its last record."""

    outbox_id: str
    worker_id: str
    batch: int
    positions: dict[int, tuple[int, int, int]]
    expect: int = 0  # the batch the flusher last saw committed: the database must hold at least that

    def positions_json(self) -> bytes:
        return orjson.dumps({str(shard): list(pos) for shard, pos in self.positions.items()})


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What one batch of outcomes did: applied, replayed (already applied), stale (its
    attempt lost its lease), missing (its job does not exist in this database), cancelled
    (an operator cancelled its job while it ran); and how many step results it inserted."""

    applied: int = 0
    replayed: int = 0
    stale: int = 0
    stale_ids: tuple[int, ...] = ()
    missing_ids: tuple[int, ...] = ()
    steps: int = 0  # step results inserted (not those already recorded, or of jobs not here)
    followups: int = 0  # follow-up jobs inserted
    cancelled_ids: tuple[int, ...] = ()  # not applied: an operator cancelled the job while the attempt ran
    # (parent id, attempt, the ids its follow-ups got: None where a live dedupe key held one)
    followup_ids: tuple[tuple[int, int, tuple[int | None, ...]], ...] = ()
    # Not applied, but their rows could take them now: inserted again by another worker (after
    # the database went back in time) since the apply looked. The caller tries them again.
    late_ids: tuple[int, ...] = ()

    def __add__(self, other: ApplyResult) -> ApplyResult:
        return ApplyResult(self.applied + other.applied, self.replayed + other.replayed, self.stale + other.stale,
                           self.stale_ids + other.stale_ids, self.missing_ids + other.missing_ids,
                           self.steps + other.steps, self.followups + other.followups,
                           self.cancelled_ids + other.cancelled_ids, self.followup_ids + other.followup_ids,
                           self.late_ids + other.late_ids)
