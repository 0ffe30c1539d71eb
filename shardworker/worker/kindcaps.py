"""The per-kind caps of the child pool: at most ``concurrency=K`` jobs of a kind at once.

A handler that sets ``concurrency`` caps its kind across the whole pool. ``KindCaps``
counts, for each capped kind, the jobs sent to children and not yet reported (finished,
returned or settled after a death); the pool sends a job of a capped kind only while its
kind is under its cap, and lets later jobs of other kinds go first meanwhile.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping

from shardworker.app import HandlerSpec


class KindCaps:
    """The caps (``limits``) and the jobs of each capped kind in the children (``by_kind``)."""

    def __init__(self, specs: Mapping[str, HandlerSpec]) -> None:
        self.limits = {kind: spec.concurrency for kind, spec in specs.items() if spec.concurrency}
        self.by_kind: collections.Counter[str] = collections.Counter()  # sent and unreported, per capped kind

    def full(self, kind: str) -> bool:
        """Whether no more jobs of ``kind`` may be sent now."""
        limit = self.limits.get(kind)
        return limit is not None and self.by_kind[kind] >= limit

    def sent(self, kind: str) -> None:
        if kind in self.limits:
            self.by_kind[kind] += 1

    def taken(self, kind: str) -> None:
        """A job of ``kind`` is off its child (reported, returned, or its child died)."""
        if kind in self.limits:
            self.by_kind[kind] -= 1


def caps_that_fill_every_child(specs: Mapping[str, HandlerSpec], procs: int) -> list[str]:
    """A line for each plain sync kind whose ``concurrency`` cap still lets its jobs occupy
    every child's sync lane (a cap of ``procs`` or more): other sync kinds wait behind it."""
    return [f"kind {kind}: concurrency={spec.concurrency} lets its plain sync jobs hold every child "
            f"(--procs {procs}), so other sync jobs wait behind them; give it threads=True (or async def), "
            "a cap below --procs, or a worker of its own (docs/scheduling.md)"
            for kind, spec in sorted(specs.items())
            if spec.lane == "sync" and spec.concurrency is not None and spec.concurrency >= procs]
