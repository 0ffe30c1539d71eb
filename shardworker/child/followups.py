"""A handler run's follow-up jobs (``job.enqueue``), validated as ``enqueue`` validates and
encoded as they come; the outcome record carries them (``shardworker.core.followups``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from shardworker.client import JobSpec, check_delay
from shardworker.core import tracing
from shardworker.core.followups import MAX_AFTER, MAX_FOLLOWUP_BYTES, MAX_FOLLOWUPS, FollowUp, check_after
from shardworker.errors import EnqueueError


class FollowUps:
    """The follow-up jobs of one handler run, validated and encoded as they come."""

    def __init__(self) -> None:
        self._encoded: list[bytes] = []
        self._bytes = 0
        self._by_key: dict[str, FollowUp] = {}

    def add(self, kind: str, payload: Any, *, queue: str, priority: int, delay_s: float, max_attempts: int,
            dedupe_key: str | None, after: Iterable[Any] | None, key: str | None = None,
            tags: Iterable[str] = ()) -> FollowUp:
        spec = JobSpec(kind, payload, queue, priority, max_attempts, None, dedupe_key, key=key,
                       tags=tags)  # type: ignore[arg-type]
        delay = check_delay(delay_s)
        refs = self._refs(after)
        if dedupe_key is not None and dedupe_key in self._by_key:
            return self._by_key[dedupe_key]  # the same key twice in one run: one job
        if len(self._encoded) >= MAX_FOLLOWUPS:
            raise EnqueueError(f"job.enqueue: more than {MAX_FOLLOWUPS} follow-up jobs in one run")
        fields = [spec.kind, spec.payload_json(), spec.queue, spec.priority, spec.max_attempts, delay,
                  spec.dedupe_key, refs]
        entry = orjson.dumps([*fields, *([spec.key, list(spec.tags)] if spec.tags else
                                         [spec.key] if spec.key is not None else [])])
        if self._bytes + len(entry) > MAX_FOLLOWUP_BYTES:
            raise EnqueueError(f"job.enqueue: the run's follow-up jobs exceed {MAX_FOLLOWUP_BYTES} bytes "
                               "encoded; enqueue fewer from one job, or chain jobs that enqueue the rest")
        self._bytes += len(entry)  # (a trace is not counted: tracing never refuses a follow-up)
        trace = tracing.followup(spec.kind, spec.queue)  # its enqueue's span, when the application traces
        if trace is not None:
            entry = orjson.dumps([*fields, spec.key, list(spec.tags), trace])
        handle = FollowUp(len(self._encoded), spec.kind, self)
        self._encoded.append(entry)
        if dedupe_key is not None:
            self._by_key[dedupe_key] = handle
        return handle

    def _refs(self, after: Iterable[Any] | None) -> list[int]:
        if after is None:
            return []
        if isinstance(after, FollowUp | str | bytes) or not isinstance(after, Iterable):
            raise EnqueueError(f"after must be a list of job ids and follow-up handles, got {type(after).__name__}")
        refs: dict[int, None] = {}
        for ref in after:
            if isinstance(ref, FollowUp):
                if ref.run is not self:
                    raise EnqueueError(f"after: {ref!r} was enqueued by another run")
                refs[-(ref.index + 1)] = None
            else:
                refs[check_after([ref])[0]] = None
        if len(refs) > MAX_AFTER:
            raise EnqueueError(f"after: {len(refs)} jobs, the limit is {MAX_AFTER}")
        return list(refs)

    def __len__(self) -> int:
        return len(self._encoded)

    def encode(self) -> bytes | None:
        """The follow-ups as the outcome record carries them; None when there are none."""
        return b"[" + b",".join(self._encoded) + b"]" if self._encoded else None
