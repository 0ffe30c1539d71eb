"""Enqueueing jobs: ``enqueue`` one, ``enqueue_many`` in bulk through COPY, and their
asyncio twins ``enqueue_async`` and ``enqueue_many_async``.

Each accepts a DSN string or an open psycopg connection (used as is, not closed).
Validation happens before anything is sent: a bulk input with one bad entry enqueues
nothing and names the entry. With ``strict=True`` a kind no live worker has registered in
the job's queue is refused (``KindNotServed``), nothing enqueued: one query more, asked
only then (``shardworker.store.serving``).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from shardworker.core import tracing
from shardworker.core.followups import DependentRow, check_after
from shardworker.core.limits import (
    DEFAULT_MAX_ATTEMPTS,
    MAX_DEDUPE_KEY_BYTES,
    MAX_DELAY_S,
    MAX_JOB_KEY_BYTES,
    MAX_KIND_BYTES,
    MAX_PAYLOAD_BYTES,
    MAX_QUEUE_BYTES,
    MAX_TAG_BYTES,
    MAX_TAGS,
    not_storable_text,
    too_long,
    unservable_queue_name,
)
from shardworker.core.model import has_non_finite
from shardworker.errors import EnqueueError

_INT32 = (-(2**31), 2**31 - 1)
# make_interval(secs => ...) takes a float8; past ~290,000 years timestamptz overflows anyway.
# Handlers read payloads with orjson, which turns integers outside these bounds into floats.
_INT_RANGE = (-(2**63), 2**64 - 1)
BEYOND_64_BITS = ("payload holds an integer beyond 64 bits, which a handler would receive changed; "
                  "pass it as a string")
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_LONG_DIGITS = re.compile(r"\d{19}")  # |i| < 10**18 is exact whatever parses it
_LONG_DIGITS_BYTES = re.compile(rb"\d{19}")


@dataclass(frozen=True)
class JobSpec:
    """A job to enqueue, validated."""

    kind: str
    payload: Any = None
    queue: str = "default"
    priority: int = 0
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    run_at: datetime | None = None
    dedupe_key: str | None = None
    after: tuple[int, ...] = ()  # ids of jobs it waits on (shardworker.core.followups)
    # Whose job it is (a tenant, an account): claims take a queue's keys in turn, and
    # key_concurrency caps how many of one key run at once (docs/scheduling.md).
    key: str | None = None
    # With dedupe_key: a job with the key enqueued or ended within this many seconds (done and
    # failed ones too) makes this one a duplicate; or, debounce, run it this many seconds after
    # the last enqueue, replacing the payload of the one still queued (docs/enqueue-and-results.md).
    dedupe_window: float | None = None
    debounce: float | None = None
    # Labels to find the job by (``jobs list --tag``, bulk ``jobs retry|cancel|delete --tag``):
    # kept sorted and without repeats.
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "after", check_after(self.after))
        object.__setattr__(self, "tags", check_tags(self.tags))
        if not isinstance(self.kind, str) or not self.kind:
            raise EnqueueError("kind must be a non-empty string")
        if not isinstance(self.queue, str) or not self.queue:
            raise EnqueueError("queue must be a non-empty string")
        if (not isinstance(self.priority, int) or isinstance(self.priority, bool)
                or not _INT32[0] <= self.priority <= _INT32[1]):
            raise EnqueueError("priority must be a 32-bit integer")
        if (not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool)
                or not 1 <= self.max_attempts <= _INT32[1]):
            raise EnqueueError("max_attempts must be an integer from 1 to 2147483647")
        if self.dedupe_key is not None and not isinstance(self.dedupe_key, str):
            raise EnqueueError("dedupe_key must be a string")
        if self.dedupe_key is not None and not self.dedupe_key.strip():  # unset variables in a script, most likely
            raise EnqueueError("dedupe_key must not be empty or white space only (leave it out for a job without one)")
        for name in ("dedupe_window", "debounce"):
            value = getattr(self, name)
            if value is None:
                continue
            if self.dedupe_key is None:
                raise EnqueueError(f"{name} needs a dedupe_key: the key it applies to")
            if self.after:
                raise EnqueueError(f"{name} does not go with after= (a job that waits on others)")
            object.__setattr__(self, name, check_delay(value, name))
        if self.dedupe_window is not None and self.debounce is not None:
            raise EnqueueError("give dedupe_window or debounce, not both")
        if self.key is not None and (not isinstance(self.key, str) or not self.key.strip()):
            raise EnqueueError("key must be a non-empty string (leave it out for a job of no one's in particular)")
        for name, value, limit in (("kind", self.kind, MAX_KIND_BYTES), ("queue", self.queue, MAX_QUEUE_BYTES),
                                   ("dedupe_key", self.dedupe_key, MAX_DEDUPE_KEY_BYTES),
                                   ("key", self.key, MAX_JOB_KEY_BYTES)):
            why = None if value is None else too_long(name, value, limit) or not_storable_text(name, value)
            if why:
                raise EnqueueError(why)
        if why := unservable_queue_name(self.queue):
            raise EnqueueError(why)

    def payload_json(self) -> str:
        try:
            data = orjson.dumps(self.payload)
        except TypeError as exc:
            if "64-bit" in str(exc):
                raise EnqueueError(BEYOND_64_BITS) from exc
            raise EnqueueError(f"payload is not JSON-serializable: {exc}") from exc
        if len(data) > MAX_PAYLOAD_BYTES:
            raise EnqueueError(f"payload too large: {len(data)} bytes of JSON, the limit is {MAX_PAYLOAD_BYTES} "
                               "(shardworker.core.limits.MAX_PAYLOAD_BYTES); store big data elsewhere and pass a key")
        if b"null" in data and has_non_finite(self.payload):  # orjson writes nan and inf as null
            raise EnqueueError("payload holds a float that is not a finite number (nan or infinity), "
                               "which JSON cannot hold")
        text = data.decode()
        # orjson writes a NUL as \u0000; the six characters \u0000 as \\u0000 (an even run
        # of backslashes before "u0000" is text, an odd one ends in a NUL).
        if "\\u0000" in text and _NUL_ESCAPE.search(text):
            raise EnqueueError("payload holds a NUL character (\\u0000), which PostgreSQL jsonb cannot store")
        return text

    @classmethod
    def from_mapping(cls, obj: Mapping[str, Any]) -> JobSpec:
        """From a bulk-file object: kind, payload, optional queue, priority, max_attempts,
        run_at (ISO 8601), dedupe_key, after (job ids), key, dedupe_window, debounce."""
        if not isinstance(obj, Mapping):
            raise EnqueueError("expected a JSON object")
        unknown = set(obj) - {"kind", "payload", "queue", "priority", "max_attempts", "run_at", "dedupe_key", "after",
                              "key", "dedupe_window", "debounce", "tags"}
        if unknown:
            raise EnqueueError(f"unknown field(s) {', '.join(sorted(unknown))}")
        if "kind" not in obj:
            raise EnqueueError("missing field 'kind'")
        after = obj.get("after", [])
        if not isinstance(after, list):  # 0, false, "" or null would silently mean no dependency
            raise EnqueueError(f"after must be a list of job ids (like [12, 13]), got {orjson.dumps(after).decode()}")
        run_at = obj.get("run_at")
        if run_at is not None:
            try:
                run_at = datetime.fromisoformat(str(run_at))
            except ValueError as exc:
                raise EnqueueError(f"run_at is not an ISO 8601 time: {run_at!r}") from exc
        tags = obj.get("tags", [])
        if not isinstance(tags, list):
            raise EnqueueError(f"tags must be a list of strings (like [\"import\"]), got {orjson.dumps(tags).decode()}")
        return cls(obj["kind"], obj.get("payload"), obj.get("queue", "default"), obj.get("priority", 0),
                   obj.get("max_attempts", DEFAULT_MAX_ATTEMPTS), run_at, obj.get("dedupe_key"), after, obj.get("key"),
                   obj.get("dedupe_window"), obj.get("debounce"), tags)  # type: ignore[arg-type]


def check_tags(tags: Any) -> tuple[str, ...]:
    """``tags`` as a sorted tuple without repeats; ``EnqueueError`` saying what is wrong."""
    if tags is None:
        return ()
    if isinstance(tags, str | bytes) or not isinstance(tags, Iterable):
        raise EnqueueError(f"tags must be a list of strings, got {type(tags).__name__}")
    found = set()
    for tag in tags:
        if not isinstance(tag, str) or not tag.strip():
            raise EnqueueError(f"a tag must be a non-empty string, got {tag!r:.80}")
        if why := too_long("tag", tag, MAX_TAG_BYTES) or not_storable_text("tag", tag):
            raise EnqueueError(why)
        found.add(tag)
    if len(found) > MAX_TAGS:
        raise EnqueueError(f"{len(found)} tags, the most a job may carry is {MAX_TAGS} "
                           "(shardworker.core.limits.MAX_TAGS)")
    return tuple(sorted(found))


def loads_json(text: str | bytes) -> Any:
    """JSON text as Python values, refusing (``EnqueueError``) an integer beyond 64 bits,
    which orjson would silently read as a float: numbers are never changed on their way in.
    Raises ``orjson.JSONDecodeError`` for text that is not JSON."""
    value = orjson.loads(text)
    digits = _LONG_DIGITS.search(text) if isinstance(text, str) else _LONG_DIGITS_BYTES.search(text)
    if digits:  # rare: look at each integer as written (orjson has accepted the syntax)
        json.loads(text, parse_int=_checked_int)
    return value


def _checked_int(digits: str) -> int:
    if len(digits.lstrip("-")) > 20 or not _INT_RANGE[0] <= int(digits) <= _INT_RANGE[1]:
        raise EnqueueError(BEYOND_64_BITS)
    return int(digits)


def using_schema(name: str | None) -> contextlib.AbstractContextManager[None]:
    """Within the block (this thread or asyncio task only), every call of this library reads
    and writes the jobs of schema ``name``: an app with a schema of its own on a shared
    database (``shardworker migrate --schema NAME`` creates it; None: the process's schema,
    ``SHARDWORKER_SCHEMA`` or ``shardworker``). The enqueue functions, ``get_job``,
    ``wait_for`` and ``send_event`` also take ``schema=`` for one call."""
    if name is None:
        return contextlib.nullcontext()
    from shardworker.store.sql import using_schema as block  # (psycopg only when a schema is named)

    return block(name)


def _utc(run_at: datetime | None) -> datetime | None:
    """A naive time is UTC, everywhere (as ``jobs list --since`` reads one), never the
    database session's time zone."""
    return run_at.replace(tzinfo=UTC) if run_at is not None and run_at.tzinfo is None else run_at


def enqueue(conn_or_dsn: Any, kind: str, payload: Any = None, *, queue: str = "default", priority: int = 0,
            max_attempts: int = DEFAULT_MAX_ATTEMPTS, run_at: datetime | None = None, delay_s: float = 0.0,
            dedupe_key: str | None = None, after: Iterable[int] = (), strict: bool = False,
            key: str | None = None, dedupe_window: float | None = None, debounce: float | None = None,
            tags: Iterable[str] = (), schema: str | None = None) -> int | None:
    """Enqueue one job and wake idle workers; returns its id, or None if ``dedupe_key`` is live.
    With ``after=[ids]`` it waits (status ``waiting``) until those jobs are done; an id that
    does not exist refuses the call (``EnqueueError``), enqueueing nothing. With ``strict``, a
    kind no live worker serves in ``queue`` is refused (``KindNotServed``). ``key`` says whose
    job it is (a tenant): claims take a queue's keys in turn, and ``key_concurrency`` caps
    how many jobs of one key run at once. With ``dedupe_key``, ``dedupe_window`` (seconds)
    makes a job with the key enqueued or ended within the window a duplicate too (done and
    failed ones included), and ``debounce`` (seconds) runs the job that long after the last
    enqueue: one still queued with the key gets this payload and that run_at, and its id
    comes back. ``tags`` label the job (at most 20, each up to 255 bytes): ``jobs list --tag``
    and the bulk ``jobs retry|cancel|delete --tag`` find it by them.

    ``conn_or_dsn`` is an open ``psycopg.Connection`` (the caller's: inside its open
    transaction the job commits or rolls back with it, and workers wake at its commit) or a
    DSN string, which opens and closes a connection per call (milliseconds): pass a
    connection, or one from ``psycopg_pool.ConnectionPool.connection()``, for anything frequent.
    """
    with using_schema(schema):
        spec, fields = _one_job(kind, payload, queue, priority, max_attempts, run_at, delay_s, dedupe_key, after, key,
                                dedupe_window, debounce, tags)
        if strict:
            from shardworker.store.serving import refuse_unserved

            refuse_unserved(conn_or_dsn, [(spec.queue, spec.kind)])
        if spec.after:
            from shardworker.store.dependencies import enqueue_dependents

            return enqueue_dependents(conn_or_dsn, [_dependent_row(spec, fields["trace"], fields["delay_s"])])[0]
        from shardworker.store.enqueue import enqueue_one

        return enqueue_one(conn_or_dsn, spec.kind, spec.payload_json(), **fields)


async def enqueue_async(aconn_or_dsn: Any, kind: str, payload: Any = None, *, queue: str = "default",
                        priority: int = 0, max_attempts: int = DEFAULT_MAX_ATTEMPTS, run_at: datetime | None = None,
                        delay_s: float = 0.0, dedupe_key: str | None = None, after: Iterable[int] = (),
                        strict: bool = False, key: str | None = None, dedupe_window: float | None = None,
                        debounce: float | None = None, tags: Iterable[str] = (),
                        schema: str | None = None) -> int | None:
    """``enqueue`` for asyncio code: ``await enqueue_async(aconn, "email", {...})``.

    ``aconn_or_dsn`` is an open ``psycopg.AsyncConnection`` (inside the caller's open
    transaction the job commits or rolls back with it) or a DSN string, which opens and
    closes an async connection per call. Nothing here blocks the event loop.
    """
    with using_schema(schema):
        spec, fields = _one_job(kind, payload, queue, priority, max_attempts, run_at, delay_s, dedupe_key, after, key,
                                dedupe_window, debounce, tags)
        if strict:
            from shardworker.store.serving import refuse_unserved_async

            await refuse_unserved_async(aconn_or_dsn, [(spec.queue, spec.kind)])
        if spec.after:
            from shardworker.store.dependencies import enqueue_dependents_async

            row = _dependent_row(spec, fields["trace"], fields["delay_s"])
            return (await enqueue_dependents_async(aconn_or_dsn, [row]))[0]
        from shardworker.store.enqueue_async import enqueue_one_async

        return await enqueue_one_async(aconn_or_dsn, spec.kind, spec.payload_json(), **fields)


def _one_job(kind: str, payload: Any, queue: str, priority: int, max_attempts: int, run_at: datetime | None,
             delay_s: float, dedupe_key: str | None, after: Iterable[int], key: str | None,
             dedupe_window: float | None = None, debounce: float | None = None,
             tags: Iterable[str] = ()) -> tuple[JobSpec, dict[str, Any]]:
    """The validated spec and the insert's other fields, before anything is sent."""
    spec = JobSpec(kind, payload, queue, priority, max_attempts, run_at, dedupe_key, after, key,  # type: ignore[arg-type]
                   dedupe_window, debounce, tags)  # type: ignore[arg-type]
    return spec, _fields(spec, tracing.carrier(), check_delay(delay_s))


def _fields(spec: JobSpec, trace: str | None, delay_s: float = 0.0) -> dict[str, Any]:
    """The insert's fields of ``spec`` but its kind and payload; ``trace``: the enqueue's
    (``tracing.carrier``, taken once for a batch)."""
    return {"queue": spec.queue, "priority": spec.priority, "max_attempts": spec.max_attempts,
            "run_at": _utc(spec.run_at), "delay_s": delay_s, "dedupe_key": spec.dedupe_key, "key": spec.key,
            "dedupe_window_s": spec.dedupe_window, "debounce_s": spec.debounce, "tags": list(spec.tags) or None,
            "trace": trace}


def check_delay(delay_s: Any, name: str = "delay") -> float:
    """A delay (or a window) in seconds, checked."""
    if not isinstance(delay_s, int | float) or isinstance(delay_s, bool) or not 0 <= delay_s < MAX_DELAY_S:
        raise EnqueueError(f"{name} must be a number of seconds from 0 to {MAX_DELAY_S:.0f}, got {delay_s!r}")
    return float(delay_s)


def _dependent_row(spec: JobSpec, trace: str | None, delay_s: float = 0.0) -> DependentRow:
    """The row of a job that may wait on others; ``trace``: the enqueue's (``tracing.carrier``,
    taken once for a batch)."""
    return DependentRow(spec.kind, spec.queue, spec.payload_json(), spec.priority, spec.max_attempts,
                        _utc(spec.run_at), delay_s, spec.dedupe_key, spec.after, key=spec.key, tags=spec.tags,
                        trace=trace)


def enqueue_many(conn_or_dsn: Any, jobs: Iterable[JobSpec], *, strict: bool = False,
                 schema: str | None = None) -> list[int | None]:
    """Enqueue many jobs in one transaction (with COPY when none has ``after``); returns
    their ids in the order given, with None for a job not inserted because a live job holds
    its ``dedupe_key`` (as ``enqueue`` returns None), so ``len`` is always ``len(jobs)`` and
    the count inserted is ``sum(i is not None for i in ids)``.

    The connection rules are those of ``enqueue``; with a connection outside a transaction,
    the batch commits as one transaction of its own. With ``strict``, one job of a kind no
    live worker serves in its queue refuses the batch (``KindNotServed``).
    """
    with using_schema(schema):
        specs = list(jobs)
        trace = tracing.carrier()  # the batch's enqueue: one context for all
        if strict:
            from shardworker.store.serving import refuse_unserved

            refuse_unserved(conn_or_dsn, [(spec.queue, spec.kind) for spec in specs])
        if any(spec.after for spec in specs):
            from shardworker.store.dependencies import enqueue_dependents

            return enqueue_dependents(conn_or_dsn, [_dependent_row(s, trace) for s in specs])
        if any(spec.dedupe_window is not None or spec.debounce is not None for spec in specs):
            from shardworker.store.enqueue import enqueue_each

            return enqueue_each(conn_or_dsn, [(s.kind, s.payload_json(), _fields(s, trace)) for s in specs])
        from shardworker.store.enqueue import enqueue_rows

        return enqueue_rows(conn_or_dsn, _copy_rows(specs, trace))


async def enqueue_many_async(aconn_or_dsn: Any, jobs: Iterable[JobSpec], *, strict: bool = False,
                             schema: str | None = None) -> list[int | None]:
    """``enqueue_many`` for asyncio code, on a ``psycopg.AsyncConnection`` or a DSN: the
    same ids, the same ``strict``."""
    with using_schema(schema):
        specs = list(jobs)
        trace = tracing.carrier()  # the batch's enqueue: one context for all
        if strict:
            from shardworker.store.serving import refuse_unserved_async

            await refuse_unserved_async(aconn_or_dsn, [(spec.queue, spec.kind) for spec in specs])
        if any(spec.after for spec in specs):
            from shardworker.store.dependencies import enqueue_dependents_async

            return await enqueue_dependents_async(aconn_or_dsn, [_dependent_row(s, trace) for s in specs])
        if any(spec.dedupe_window is not None or spec.debounce is not None for spec in specs):
            from shardworker.store.enqueue_async import enqueue_each_async

            rows = [(s.kind, s.payload_json(), _fields(s, trace)) for s in specs]
            return await enqueue_each_async(aconn_or_dsn, rows)
        from shardworker.store.enqueue_async import enqueue_rows_async

        return await enqueue_rows_async(aconn_or_dsn, _copy_rows(specs, trace))


def _copy_rows(jobs: Iterable[JobSpec], trace: str | None) -> list[tuple[Any, ...]]:
    return [(j.kind, j.queue, j.payload_json(), j.priority, j.max_attempts, _utc(j.run_at), j.dedupe_key, j.key,
             list(j.tags) or None, trace)
            for j in jobs]


def parse_jsonl(lines: Iterable[str | bytes], defaults: Mapping[str, Any] | None = None) -> list[JobSpec]:
    """Parse a bulk file, all or nothing: the first bad line raises with its number.

    ``defaults`` fill fields a line leaves out (the CLI's --queue, --priority, ...).
    """
    specs = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = loads_json(line)
            if defaults and isinstance(obj, dict):
                obj = {**defaults, **obj}
            spec = JobSpec.from_mapping(obj)
            spec.payload_json()
            specs.append(spec)
        except orjson.JSONDecodeError as exc:
            raise EnqueueError(f"line {number}: invalid JSON: {exc}") from exc
        except EnqueueError as exc:
            raise EnqueueError(f"line {number}: {exc}") from exc
    return specs
