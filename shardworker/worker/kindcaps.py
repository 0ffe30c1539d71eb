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
