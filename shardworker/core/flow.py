"""Flow control's shared vocabulary: rates (``"10/s"``), parsed once for handlers and queues.

A rate limit is a token bucket kept in the database row of its kind or queue
(``shardworker.kinds``, ``shardworker.queues``): it refills at ``n`` per ``period_s`` and
holds at most a burst of tokens and half a token more, so in any window of one period at
most ``n`` plus the burst jobs start (the burst is a twentieth of ``n``, at least one: the
SQL of ``job_claim`` computes it). The half token keeps what refilled while a worker came
back late for it (its poll, a busy host): without it, a bucket of one at ``2/s`` gave 1.6
starts a second. Claims of a limited kind or queue are serialized by that row's lock and
take at most the whole tokens it holds.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from shardworker.errors import ConfigError

PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"\s*(\d{1,12})\s*/\s*([smh])\s*")  # digits bounded: int() refuses past 4,300
MAX_RATE = 1_000_000


class Rate(NamedTuple):
    """At most ``n`` starts per ``period_s`` seconds."""

    n: int
    period_s: float

    def __str__(self) -> str:
        unit = next(u for u, s in PERIODS.items() if s == self.period_s) if self.period_s in PERIODS.values() else None
        return f"{self.n}/{unit}" if unit else f"{self.n}/{self.period_s:g}s"


def shown(value: object, limit: int = 40) -> str:
    """``value`` as a refusal quotes it: its repr, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def parse_rate(text: str) -> Rate:
    """``"N/s"``, ``"N/m"`` or ``"N/h"`` (N a whole number from 1) as a ``Rate``; anything
    else raises ``ConfigError`` saying what is accepted."""
    match = _RATE.fullmatch(text) if isinstance(text, str) else None
    if match is None or not 1 <= int(match.group(1)) <= MAX_RATE:
        raise ConfigError(f"rate must look like 10/s, 600/m or 1000/h (a whole number from 1 to {MAX_RATE:,} "
                          f"per second, minute or hour); got {shown(text)}")
    return Rate(int(match.group(1)), PERIODS[match.group(2)])
