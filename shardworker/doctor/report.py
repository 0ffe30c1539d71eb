"""The values ``shardworker doctor`` reports: ``Check`` (one line: what was checked, what was
found, what to do) and its ``Status``; and ``attempt``, which turns a fact that cannot be read
into the reason why, so one missing fact never stops the other checks."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from shardworker.errors import ShardworkerError

_T = TypeVar("_T")


class Status(enum.Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Check:
    """One line of the report: what was checked, what was found, and what to do when not ok."""

    name: str
    status: Status
    detail: str
    action: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        label = "FAIL" if self.status is Status.FAIL else self.status.value
        return f"{label:<4}  {self.name:<11} {self.detail}" + (f" -> {self.action}" if self.action else "")

    def as_json(self) -> dict[str, Any]:
        return {"check": self.name, "status": self.status.value, "detail": self.detail, "action": self.action,
                **self.data}


def needs_action(checks: list[Check]) -> bool:
    return any(c.status is Status.FAIL for c in checks)

def attempt(fn: Callable[[], _T]) -> tuple[_T | None, str | None]:
    """``fn()``'s value, or None and the one-line reason it failed (a missing table, a lost connection)."""
    try:
        return fn(), None
    except ShardworkerError as exc:
        return None, str(exc)
