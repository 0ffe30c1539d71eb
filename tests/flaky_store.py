"""``FlakyStore``: a real ``PgStore`` whose chosen methods fail a chosen number of times.

The pattern of River's ``partialExecutorMock``: everything runs on a real PostgreSQL,
and only the calls a test names fail, before reaching the server (``after=False``) or
after the server did the work (``after=True``: the reply was lost)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardworker.errors import DatabaseUnavailable


@dataclass
class _Plan:
    times: int
    make: Callable[[], BaseException]
    after: bool


class FlakyStore:
    def __init__(self, store: Any) -> None:
        self.store = store
        self.plans: dict[str, _Plan] = {}
        self.calls: dict[str, int] = {}

    def fail(self, method: str, times: int = 1, *, after: bool = False,
             make: Callable[[], BaseException] = lambda: DatabaseUnavailable("database unavailable: injected")) -> None:
        """Make the next ``times`` calls of ``method`` raise ``make()``."""
        self.plans[method] = _Plan(times, make, after)

    def __getattr__(self, name: str) -> Any:
        real = getattr(self.store, name)
        if not callable(real):
            return real

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            plan = self.plans.get(name)
            if plan is None or plan.times <= 0:
                return real(*args, **kwargs)
            plan.times -= 1
            if plan.after:
                real(*args, **kwargs)
            raise plan.make()

        return call
