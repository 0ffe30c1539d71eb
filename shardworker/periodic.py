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
seen. The database's clock decides what is due, so hosts with skewed clocks agree, and a
step of a host's clock never silences or doubles a tick.

A tick happens once per scheduled instant across DST changes: on the fall-back day a
fixed-time schedule (``30 1 * * *``) runs once, at the first 01:30; one whose hour field
starts with ``*`` runs in both occurrences of the repeated hour, which are an hour apart.
A time spring-forward skips runs once, at the jump (02:30 becomes 03:00), as cron does.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
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
        """The scheduled instants in (last, now], oldest first, in UTC."""
        return list(itertools.takewhile(lambda tick: tick <= now, self._ticks_from(last)))

    def _ticks_from(self, last: datetime) -> Iterator[datetime]:
        """The scheduled instants after ``last``, in UTC, each once across the DST changes
        of the schedule's time zone (``_is_scheduled``). UTC because Python compares two
        datetimes of one zone by wall clock: 01:30 EDT == 01:30 EST."""
        previous = last
        it = croniter(self.cron, last.astimezone(self.zone))
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
        return not repeated or self.cron.split()[1].startswith("*")

    def latest_tick(self, now: datetime) -> datetime:
        """The last tick at or before ``now``."""
        start = (now + timedelta(microseconds=1)).astimezone(self.zone)
        return croniter(self.cron, start).get_prev(datetime).astimezone(UTC)

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
                 "dedupe_key": f"periodic:{self.name}:{tick.astimezone(self.zone).isoformat()}"} for tick in ticks]
        return jobs, ticks[-1]


class PeriodicStore(Protocol):
    def run_periodic(self, name: str, schedule: str, plan: Any) -> int: ...


class Scheduler:
    """Call ``run_once()`` often (every second or so): it asks the database only when a
    schedule's next tick has come by this host's clock (or ``MAX_WAIT_S`` has passed), and
    lets the database's clock and the schedule's row decide what to enqueue.

    The host's clock only spaces out the questions. It is monotonic by default, and a clock
    seen going backwards (an injected one) counts as due at once, so a step of the host's
    clock never silences a schedule; the wait is capped because a monotonic clock stands
    still while the host sleeps and the database's clock may be stepped forward."""

    MAX_WAIT_S = 60.0

    def __init__(self, store: PeriodicStore, schedules: Sequence[Schedule],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.schedules, self.clock = store, list(schedules), clock
        self._asked: dict[str, tuple[float, float]] = {}  # name -> (asked at, next look), host clock
        self.enqueued = 0

    def run_once(self) -> int:
        """Enqueue what is due; how many jobs. Database errors propagate (the caller backs off)."""
        now = self.clock()
        inserted = sum(self._run_schedule(schedule, now) for schedule in self.schedules if self._due(schedule, now))
        self.enqueued += inserted
        return inserted

    def _due(self, schedule: Schedule, now: float) -> bool:
        asked_at, next_look = self._asked.get(schedule.name, (now, now))
        return not asked_at <= now < next_look

    def _run_schedule(self, schedule: Schedule, now: float) -> int:
        seen: list[datetime] = []

        def plan(db_now: datetime, last_tick: datetime | None) -> tuple[list[dict[str, Any]], datetime]:
            seen.append(db_now)
            return schedule.plan(db_now, last_tick)

        jobs = self.store.run_periodic(schedule.name, schedule.cron, plan)
        if jobs:
            log.info("periodic %s: enqueued %d job(s) of kind %s", schedule.name, jobs, schedule.kind)
        # Next look when the database's clock reaches the next tick, on this host's clock.
        wait = (schedule.next_tick(seen[-1]) - seen[-1]).total_seconds()
        self._asked[schedule.name] = (now, now + min(wait, self.MAX_WAIT_S))
        return jobs
