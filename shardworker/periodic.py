"""Periodic jobs: cron schedules that enqueue a job at every tick, once across all workers.

::

    app.periodic("*/5 * * * *", kind="report", payload={"scope": "daily"})

    @app.periodic("0 3 * * *", kind="cleanup")       # schedules and registers the handler
    def cleanup(job: Job) -> None: ...

Cron expressions are parsed by ``croniter`` (five fields, or six with seconds last), in
UTC unless ``tz`` names a time zone. Each schedule has a row in ``shardworker.periodic``
holding the last tick it enqueued. A worker with the schedule takes that row's lock,
enqueues every tick due since (``run_at`` = the tick, dedupe key
``periodic:<name>:<tick>``) and moves ``last_tick``, in one transaction: a tick is
enqueued once however many workers and hosts run it, and a restart, or every worker being
down for a while, neither skips nor doubles a tick (up to ``catch_up`` missed ticks are
enqueued; older ones are logged and skipped). Ticks start after the schedule is first
seen. The database's clock decides what is due, so hosts with skewed clocks agree.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson
from croniter import croniter

from shardworker.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_CATCH_UP = 100


@dataclass(frozen=True)
class Schedule:
    """One periodic job: what to enqueue at every tick of ``cron``."""

    cron: str
    kind: str
    payload_json: str = "null"
    name: str = ""  # defaults to the kind
    queue: str = "default"
    priority: int = 0
    max_attempts: int = 25
    tz: str = "UTC"
    catch_up: int = DEFAULT_CATCH_UP
    zone: ZoneInfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not self.kind:
            raise ConfigError("a periodic job's kind must be a non-empty string")
        if not isinstance(self.cron, str) or not croniter.is_valid(self.cron):
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

    @staticmethod
    def encode_payload(kind: str, payload: Any) -> str:
        try:
            return orjson.dumps(payload).decode()
        except orjson.JSONEncodeError as exc:
            raise ConfigError(f"periodic {kind!r}: payload is not JSON-serializable: {exc}") from None

    def ticks_after(self, last: datetime, now: datetime) -> list[datetime]:
        """Ticks in (last, now], oldest first."""
        found: list[datetime] = []
        it = croniter(self.cron, last.astimezone(self.zone))
        while (tick := it.get_next(datetime)) <= now:
            found.append(tick)
        return found

    def latest_tick(self, now: datetime) -> datetime:
        """The last tick at or before ``now``."""
        return croniter(self.cron, (now + timedelta(microseconds=1)).astimezone(self.zone)).get_prev(datetime)

    def next_tick(self, now: datetime) -> datetime:
        return croniter(self.cron, now.astimezone(self.zone)).get_next(datetime)

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
                 "dedupe_key": f"periodic:{self.name}:{tick.isoformat()}"} for tick in ticks]
        return jobs, ticks[-1]


class PeriodicStore(Protocol):
    def run_periodic(self, name: str, schedule: str, plan: Any) -> int: ...


class Scheduler:
    """Call ``run_once()`` often (every second or so): it asks the database only when a
    schedule's next tick has come by this host's clock, and lets the database's clock and
    the schedule's row decide what to enqueue."""

    def __init__(self, store: PeriodicStore, schedules: Sequence[Schedule],
                 clock: Any = time.time) -> None:
        self.store, self.schedules, self.clock = store, list(schedules), clock
        self._due_at: dict[str, float] = {}  # name -> this host's time of its next tick
        self.enqueued = 0

    def run_once(self) -> int:
        """Enqueue what is due; how many jobs. Database errors propagate (the caller backs off)."""
        inserted = 0
        now = self.clock()
        for schedule in self.schedules:
            if now < self._due_at.get(schedule.name, 0.0):
                continue
            seen: list[datetime] = []

            def plan(db_now: datetime, last_tick: datetime | None, schedule: Schedule = schedule,
                     seen: list[datetime] = seen) -> tuple[list[dict[str, Any]], datetime]:
                seen.append(db_now)
                return schedule.plan(db_now, last_tick)

            jobs = self.store.run_periodic(schedule.name, schedule.cron, plan)
            if jobs:
                log.info("periodic %s: enqueued %d job(s) of kind %s", schedule.name, jobs, schedule.kind)
            inserted += jobs
            # Next look when the database's clock reaches the next tick, on this host's clock.
            db_now = seen[-1]
            self._due_at[schedule.name] = now + (schedule.next_tick(db_now) - db_now).total_seconds()
        self.enqueued += inserted
        return inserted
