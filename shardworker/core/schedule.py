"""A periodic job's schedule: the cron expression, its time zone, and what to enqueue at each tick.

A value the app declares (``app.periodic``); ``shardworker.worker.periodic`` runs it. How ticks
behave across workers, restarts and DST is told there.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson

from shardworker.core.limits import DEFAULT_MAX_ATTEMPTS
from shardworker.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_CATCH_UP = 100
# cron's aliases, as their five fields: the hour field decides the fall-back hour (_is_scheduled).
ALIASES = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
           "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}


@dataclass(frozen=True)
class Schedule:
    """One periodic job: what to enqueue at every tick of ``cron``."""

    cron: str
    kind: str
    payload_json: str = "null"
    name: str = ""  # defaults to the kind
    queue: str = "default"
    priority: int = 0
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    tz: str = "UTC"
    catch_up: int = DEFAULT_CATCH_UP
    zone: ZoneInfo = field(init=False, repr=False, compare=False)
    fields: tuple[str, ...] = field(init=False, repr=False, compare=False)  # ``cron``, an alias spelled out

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not self.kind:
            raise ConfigError("a periodic job's kind must be a non-empty string")
        if not isinstance(self.cron, str) or not _croniter().is_valid(self.cron):
            raise ConfigError(f"periodic {self.kind!r}: {self.cron!r} is not a cron expression "
                              "(five fields, or six with seconds last)")
        if not isinstance(self.catch_up, int) or self.catch_up < 1:
            raise ConfigError(f"periodic {self.kind!r}: catch_up must be an integer >= 1")
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ConfigError(f"periodic {self.kind!r}: max_attempts must be an integer >= 1")
        try:
            zone = ZoneInfo(self.tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise ConfigError(f"periodic {self.kind!r}: unknown time zone {self.tz!r}") from None
        object.__setattr__(self, "zone", zone)
        object.__setattr__(self, "name", self.name or self.kind)
        object.__setattr__(self, "fields", tuple(ALIASES.get(self.cron.strip().lower(), self.cron).split()))

    @staticmethod
    def encode_payload(kind: str, payload: Any) -> str:
        try:
            return orjson.dumps(payload).decode()
        except orjson.JSONEncodeError as exc:
            raise ConfigError(f"periodic {kind!r}: payload is not JSON-serializable: {exc}") from None

    def ticks_after(self, last: datetime, now: datetime) -> list[datetime]:
        """The scheduled instants in (last, now], oldest first, in UTC."""
        return list(itertools.takewhile(lambda tick: tick <= now, self._ticks_from(last)))

    def _ticks_from(self, last: datetime) -> Iterator[datetime]:
        """The scheduled instants after ``last``, in UTC, each once across the DST changes
        of the schedule's time zone (``_is_scheduled``). UTC because Python compares two
        datetimes of one zone by wall clock: 01:30 EDT == 01:30 EST."""
        previous = last
        it = _croniter()(" ".join(self.fields), last.astimezone(self.zone))
        while True:
            tick = it.get_next(datetime).astimezone(UTC)
            if tick > previous and self._is_scheduled(tick):
                previous = tick
                yield tick

    def _is_scheduled(self, tick: datetime) -> bool:
        """False for the second occurrence of a wall-clock time the fall-back hour repeats,
        unless the hour field starts with ``*``: as cron does, a fixed-time schedule runs
        once (at the first occurrence), an hourly or finer one every real hour. A time that
        spring-forward skips is run once at the jump (croniter's answer, and cron's)."""
        local = tick.astimezone(self.zone)
        repeated = local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()
        return not repeated or self.fields[1].startswith("*")

    def latest_tick(self, now: datetime) -> datetime:
        """The last tick at or before ``now``."""
        start = (now + timedelta(microseconds=1)).astimezone(self.zone)
        return _croniter()(" ".join(self.fields), start).get_prev(datetime).astimezone(UTC)

    def next_tick(self, now: datetime) -> datetime:
        """The first scheduled instant after ``now``."""
        return next(self._ticks_from(now))

    def plan(self, now: datetime, last_tick: datetime | None) -> tuple[list[dict[str, Any]], datetime]:
        """The jobs to insert for the ticks due at ``now`` since ``last_tick``, and the new
        last tick (``run_periodic``'s callback)."""
        if last_tick is None:
            return [], self.latest_tick(now)  # first sight: start with the next tick
        ticks = self.ticks_after(last_tick, now) if last_tick < now else []
        if not ticks:
            return [], last_tick
        if len(ticks) > self.catch_up:
            log.warning("periodic %s: %d ticks were missed from %s to %s; enqueueing the last %d (catch_up)",
                        self.name, len(ticks), ticks[0].isoformat(), ticks[-1].isoformat(), self.catch_up)
            ticks = ticks[-self.catch_up:]
        jobs = [{"kind": self.kind, "payload_json": self.payload_json, "queue": self.queue,
                 "priority": self.priority, "max_attempts": self.max_attempts, "run_at": tick, "delay_s": 0.0,
                 "dedupe_key": f"periodic:{self.name}:{tick.astimezone(self.zone).isoformat()}", "key": None}
                for tick in ticks]
        return jobs, ticks[-1]


def _croniter() -> Any:
    """croniter, imported with the first cron schedule: a worker without one never pays its import."""
    from croniter import croniter

    return croniter
