"""Enqueueing jobs: ``enqueue`` one, ``enqueue_many`` in bulk through COPY.

Both accept a DSN string or an open psycopg connection (used as is, not closed).
Validation happens before anything is sent: a bulk input with one bad entry enqueues
nothing and names the entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from shardworker.errors import EnqueueError

DEFAULT_MAX_ATTEMPTS = 25
_INT32 = (-(2**31), 2**31 - 1)


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

    def __post_init__(self) -> None:
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

    def payload_json(self) -> str:
        try:
            text = orjson.dumps(self.payload).decode()
        except TypeError as exc:
            raise EnqueueError(f"payload is not JSON-serializable: {exc}") from exc
        if "\\u0000" in text:
            raise EnqueueError("payload holds a NUL character (\\u0000), which PostgreSQL jsonb cannot store")
        return text

    @classmethod
    def from_mapping(cls, obj: Mapping[str, Any]) -> JobSpec:
        """From a bulk-file object: kind, payload, optional queue, priority, max_attempts,
        run_at (ISO 8601), dedupe_key."""
        if not isinstance(obj, Mapping):
            raise EnqueueError("expected a JSON object")
        unknown = set(obj) - {"kind", "payload", "queue", "priority", "max_attempts", "run_at", "dedupe_key"}
        if unknown:
            raise EnqueueError(f"unknown field(s) {', '.join(sorted(unknown))}")
        if "kind" not in obj:
            raise EnqueueError("missing field 'kind'")
        run_at = obj.get("run_at")
        if run_at is not None:
            try:
                run_at = datetime.fromisoformat(str(run_at))
            except ValueError as exc:
                raise EnqueueError(f"run_at is not an ISO 8601 time: {run_at!r}") from exc
        return cls(obj["kind"], obj.get("payload"), obj.get("queue", "default"), obj.get("priority", 0),
                   obj.get("max_attempts", DEFAULT_MAX_ATTEMPTS), run_at, obj.get("dedupe_key"))


def _store_for(conn_or_dsn: Any) -> Any:
    from shardworker.pg_store import PgStore, StoreConfig

    if isinstance(conn_or_dsn, str):
        # Bulk loads may take minutes: no 30 s statement timeout here.
        return PgStore(StoreConfig(conn_or_dsn, statement_timeout_s=3600.0)), True
    return PgStore.borrowing(conn_or_dsn), False


def enqueue(conn_or_dsn: Any, kind: str, payload: Any = None, *, queue: str = "default", priority: int = 0,
            max_attempts: int = DEFAULT_MAX_ATTEMPTS, run_at: datetime | None = None, delay_s: float = 0.0,
            dedupe_key: str | None = None) -> int | None:
    """Enqueue one job and wake idle workers; returns its id, or None if ``dedupe_key`` is live."""
    spec = JobSpec(kind, payload, queue, priority, max_attempts, run_at, dedupe_key)
    if delay_s < 0:
        raise EnqueueError("delay must be >= 0")
    store, owned = _store_for(conn_or_dsn)
    try:
        return store.enqueue(spec.kind, spec.payload_json(), queue=spec.queue, priority=spec.priority,
                             max_attempts=spec.max_attempts, run_at=spec.run_at, delay_s=delay_s,
                             dedupe_key=spec.dedupe_key)
    finally:
        if owned:
            store.close()


def enqueue_many(conn_or_dsn: Any, jobs: Iterable[JobSpec]) -> int:
    """Enqueue many jobs in one transaction with COPY; returns how many were inserted."""
    rows = [(j.kind, j.queue, j.payload_json(), j.priority, j.max_attempts, j.run_at, j.dedupe_key) for j in jobs]
    store, owned = _store_for(conn_or_dsn)
    try:
        return int(store.enqueue_many(rows))
    finally:
        if owned:
            store.close()


def parse_jsonl(lines: Iterable[str | bytes], defaults: Mapping[str, Any] | None = None) -> list[JobSpec]:
    """Parse a bulk file, all or nothing: the first bad line raises with its number.

    ``defaults`` fill fields a line leaves out (the CLI's --queue, --priority, ...).
    """
    specs = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
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
