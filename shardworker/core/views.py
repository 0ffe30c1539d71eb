"""What the store reads back for operators: plain, frozen values.

``JobInfo`` and ``WorkerInfo`` are a job's and a worker's rows (``jobs show``, ``workers``),
``StepInfo`` a step a job recorded, ``ErrorInfo`` one of its failed attempts; ``FlowCount`` is
what a worker's heartbeat reports of the jobs it holds, ``BacklogRow``, ``QueueState`` and
``QueueInfo`` what ``shardworker queues`` shows, ``Serving`` what a worker's heartbeat says it
serves, ``UnservedKind`` queued jobs of a kind no live worker serves (``doctor``, the dashboard),
``Beat`` what a heartbeat did, ``Rescued`` what a rescue of silent workers did.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from shardworker.core.flow import Rate


class Beat(NamedTuple):
    """What a heartbeat did: who else holds the row (None: written), whether it inserted it,
    whether a rescue had removed the row this process had (a tombstone says so), the row's
    started_at, and which server the beat reached (``server_identity``)."""

    holder: tuple[str, int] | None
    inserted: bool
    rescued: bool = False
    started_at: Any = None  # a datetime
    server: str = ""


class Rescued(NamedTuple):
    """What one rescue did: the silent workers whose rows it removed, the jobs it requeued."""

    workers: tuple[str, ...]
    jobs: list[int]


def in_utc(value: datetime) -> datetime:
    """A time in UTC: the one zone every command prints, whatever the session's time zone."""
    return value.astimezone(UTC)


def json_value(value: Any) -> Any:
    """A field as JSON takes it: a time as ISO 8601 in UTC, anything else as it is."""
    return in_utc(value).isoformat() if isinstance(value, datetime) else value


@dataclass(frozen=True)
class JobInfo:
    """One job's row as operators see it (``shardworker.get_job``, ``jobs show``)."""

    id: int
    kind: str
    queue: str
    status: str
    attempt: int
    max_attempts: int
    priority: int
    payload: Any
    result: Any
    last_error: str | None
    created_at: datetime
    run_at: datetime
    attempted_at: datetime | None
    finished_at: datetime | None
    locked_by: str | None
    snoozes: int = 0  # runs that used no attempt (Snooze): ``attempt`` counts every run
    key: str | None = None  # whose job it is (enqueue's key=)
    progress: Any = None  # the last value its handler reported (job.progress); None: none
    # What a waiting job waits on: "sleep" (job.sleep, until wait_until), "event" (job.wait_event,
    # sent to wait_key; until wait_until when the wait has a timeout), "jobs" (those it was
    # enqueued after=); None when it is not waiting.
    wait: str | None = None
    wait_key: str | None = None
    wait_until: datetime | None = None
    tags: list[str] = field(default_factory=list)  # its labels (enqueue's tags=), sorted

    @property
    def waiting_on(self) -> str:
        """What a waiting job waits on, in a few words: ``sleep until 12:00:05Z``, ``event
        'order:42'``, ``event 'order:42' until …``, ``jobs``; empty when it is not waiting."""
        until = "" if self.wait_until is None else f" until {self.wait_until.astimezone(UTC):%Y-%m-%d %H:%M:%SZ}"
        if self.wait == "sleep":
            return f"sleep{until}"
        if self.wait == "event":
            return f"event {self.wait_key!r}{until}"
        return self.wait or ""

    @property
    def attempts_text(self) -> str:
        """Attempts used of ``max_attempts``, and the runs that used none: ``1/25``, ``2/3 +1 snoozed``."""
        used = f"{self.attempt - self.snoozes}/{self.max_attempts}"
        return f"{used} +{self.snoozes} snoozed" if self.snoozes else used

    def to_json(self) -> dict[str, Any]:
        return {k: json_value(v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class WorkerInfo:
    """One worker's heartbeat row, with how long it has been silent by the database's clock."""

    worker_id: str
    hostname: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    jobs_running: int | None
    outbox_pending: int | None
    silent_s: float
    # After how much silence its peers stop counting its running jobs toward limits across
    # workers (None: never, a drain's row or an older release's), and the slots those jobs
    # hold: {"kind:NAME": n, "queue:NAME": n} for kinds and queues limited across workers,
    # "key:KEY" for a key under a key_concurrency.
    slots_after_s: float | None = None
    slots: dict[str, int] = field(default_factory=dict)

    @property
    def slots_released(self) -> bool:
        """Whether its slots count no more: silent past its --release-slots-after (peers release
        them once they watched that much silence; a row can say so a little before)."""
        return self.slots_after_s is not None and self.silent_s >= self.slots_after_s

    def to_json(self) -> dict[str, Any]:
        return {**{k: json_value(v) for k, v in self.__dict__.items()}, "slots_released": self.slots_released}


class FlowCount(NamedTuple):
    """A worker's jobs of one queue and kind, as its heartbeat reports them (``workers.flow``):
    ``prefetched`` claimed and not started (held by the parent, sent to a child and not
    started, suspects waiting their turn), ``running`` started and not yet reported."""

    queue: str
    kind: str
    prefetched: int
    running: int


class BacklogRow(NamedTuple):
    """One queue and kind's backlog (``kind`` None: a queue with a state row and no jobs).

    ``available``: queued and due; ``scheduled``: queued for later; ``prefetched``: claimed by a
    live worker whose handler has not started; ``running``: claimed and started (the rest of the
    claimed jobs); ``oldest_available_s``: how long the oldest available job has been due (None
    when none is)."""

    queue: str
    kind: str | None
    available: int
    scheduled: int
    prefetched: int
    running: int
    oldest_available_s: float | None


class QueueState(NamedTuple):
    """A queue's operator settings (``shardworker.queues``): paused, and limits across every
    worker (None: no limit), the last per key. A queue without a row is unpaused and unlimited."""

    name: str
    paused: bool
    concurrency: int | None
    rate: Rate | None
    key_concurrency: int | None = None  # at most this many of one key's jobs running at once
    key_weights: dict[str, int] | None = None  # a key's share of the turns (1 when not named)


class LimitUse(NamedTuple):
    """A limit across workers and what uses it now (``limits_in_use``): ``scope`` ``kind`` or
    ``queue``; ``limit`` ``global_concurrency``, ``concurrency``, ``key_concurrency``,
    ``rate`` (``value`` in starts a second) or ``paused`` (a queue's, a limit of 0); ``in_use``
    the running (claimed) jobs, for a key concurrency the busiest key's (``keys_at_limit``: how
    many keys are at it), None for a rate or a pause."""

    scope: str
    name: str
    limit: str
    value: float
    in_use: float | None
    keys_at_limit: int | None = None

    @property
    def full(self) -> bool:
        """A concurrency at its limit: the jobs it holds back wait on it, not on the workers'
        capacity. (A key concurrency holds back only the keys at it: ``keys_at_limit``.)"""
        return self.limit in ("global_concurrency", "concurrency") and self.in_use is not None \
            and self.in_use >= self.value

    def text(self) -> str:
        """One line for people: ``kind api: global_concurrency 3/5``, ``queue mail: key_concurrency
        busiest key 2/2 (4 keys at it)``, ``kind sms: rate 10/s``."""
        if self.limit == "rate":
            return f"{self.scope} {self.name}: rate {self.value:g}/s"
        if self.limit == "paused":
            return f"{self.scope} {self.name}: paused (no worker claims its jobs)"
        if self.limit == "key_concurrency":
            at = f" ({self.keys_at_limit} key{'' if self.keys_at_limit == 1 else 's'} at it)" if self.keys_at_limit else ""
            return f"{self.scope} {self.name}: key_concurrency busiest key {self.in_use:g}/{self.value:g}{at}"
        return f"{self.scope} {self.name}: {self.limit} {self.in_use:g}/{self.value:g}"


class KeyBacklog(NamedTuple):
    """One key's (a tenant's) unfinished jobs, as ``stats --by key`` shows them: queued and due,
    queued for later, claimed (prefetched or started), and the oldest due one's wait."""

    key: str
    available: int
    scheduled: int
    claimed: int
    oldest_available_s: float | None


@dataclass(frozen=True)
class QueueInfo:
    """One queue as ``shardworker queues`` shows it: its state and its backlog summed over kinds
    (``BacklogRow`` says what each count means)."""

    name: str
    paused: bool
    concurrency: int | None
    rate: Rate | None
    available: int
    scheduled: int
    prefetched: int
    running: int
    oldest_available_s: float | None
    key_concurrency: int | None = None  # at most this many of one key's jobs running at once
    key_weights: dict[str, int] | None = None  # a key's share of the turns (1 when not named)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "rate": None if self.rate is None else str(self.rate)}


@dataclass(frozen=True)
class StepInfo:
    """A job's recorded step (``jobs.get_steps``); ``bytes``: the size of its result's JSON
    text (the result itself can be 64 MiB: read it from ``shardworker.job_steps``)."""

    name: str
    attempt: int
    recorded_at: datetime
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "recorded_at": json_value(self.recorded_at)}


@dataclass(frozen=True)
class ErrorInfo:
    """One failed attempt in a job's ``errors`` history (``jobs.get_errors``): its attempt,
    when it failed, its error message and its traceback (None when the failure had none: a
    timeout, a death, an outcome of an earlier release)."""

    attempt: int
    at: datetime
    error: str | None
    traceback: str | None

    @classmethod
    def of(cls, entry: dict[str, Any]) -> ErrorInfo:
        """An entry of the ``errors`` column (migration 0012)."""
        return cls(int(entry["attempt"]), datetime.fromisoformat(entry["at"]), entry.get("error"),
                   entry.get("traceback"))

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "at": json_value(self.at)}


@dataclass(frozen=True)
class LinkInfo:
    """A job another waits on, or one waiting on another (``jobs.get_links``): its id, kind
    and status (None for both when it was deleted)."""

    id: int
    kind: str | None
    status: str | None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Serving(NamedTuple):
    """What a worker's heartbeat row says it serves: its handlers' kinds in its queues (None:
    every queue), while its heartbeat is within ``rescue_after_s``; and after how much silence
    its running jobs stop counting toward limits across workers (``slots_after_s``)."""

    kinds: tuple[str, ...]
    queues: tuple[str, ...] | None
    rescue_after_s: float
    slots_after_s: float | None = None


class Watched(NamedTuple):
    """A worker's heartbeat as its peers watch it: the last beat, and the silences its row
    asks them to watch before they rescue its jobs and before they release its slots (None:
    not given)."""

    heartbeat_at: datetime
    rescue_after_s: float | None
    slots_after_s: float | None


class UnservedKind(NamedTuple):
    """Queued jobs of a kind that no live worker serves in their queue: how many, and when the
    oldest of them fell due (``waiting_s`` ago; negative when every one is scheduled later)."""

    queue: str
    kind: str
    queued: int
    oldest_run_at: datetime
    waiting_s: float

    def to_json(self) -> dict[str, Any]:
        return {**self._asdict(), "oldest_run_at": json_value(self.oldest_run_at)}
