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
step of a host's clock never silences or doubles a tick. Each check moves the row's
``updated_at``; a row no worker has checked for ``periodic_forget_s`` (a day) is forgotten
by housekeeping (``shardworker.worker.housekeeping``).

A tick happens once per scheduled instant across DST changes: on the fall-back day a
fixed-time schedule (``30 1 * * *``) runs once, at the first 01:30; one whose hour field
starts with ``*`` runs in both occurrences of the repeated hour, which are an hour apart.
A time spring-forward skips runs once, at the jump (02:30 becomes 03:00), as cron does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol

from shardworker.core.schedule import Schedule
from shardworker.errors import StoreError

log = logging.getLogger(__name__)


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
        self._failing: dict[str, str] = {}  # name -> the error its last check raised (said once)
        self.enqueued = 0

    def run_once(self) -> int:
        """Enqueue what is due; how many jobs. Database errors propagate (the caller backs off);
        any other error is one schedule's: it is logged once, that schedule is looked at again
        after ``MAX_WAIT_S``, and the others (and retention) go on."""
        now = self.clock()
        inserted = 0
        for schedule in self.schedules:
            if self._due(schedule, now):
                inserted += self._run_guarded(schedule, now)
        self.enqueued += inserted
        return inserted

    def _run_guarded(self, schedule: Schedule, now: float) -> int:
        try:
            return self._run_schedule(schedule, now)
        except StoreError:
            raise
        except Exception as exc:
            said = f"{type(exc).__name__}: {exc}"
            if self._failing.get(schedule.name) != said:
                self._failing[schedule.name] = said
                log.exception("periodic %s (%r) failed its check, skipped; the other schedules go on", schedule.name,
                              schedule.cron)
            self._asked[schedule.name] = (now, now + self.MAX_WAIT_S)
            return 0

    def _due(self, schedule: Schedule, now: float) -> bool:
        asked_at, next_look = self._asked.get(schedule.name, (now, now))
        return not asked_at <= now < next_look

    def _run_schedule(self, schedule: Schedule, now: float) -> int:
        seen: list[datetime] = []

        def plan(db_now: datetime, last_tick: datetime | None) -> tuple[list[dict[str, Any]], datetime]:
            seen.append(db_now)
            return schedule.plan(db_now, last_tick)

        jobs = self.store.run_periodic(schedule.name, schedule.cron, plan)
        self._failing.pop(schedule.name, None)
        if jobs:
            log.debug("periodic %s: enqueued %d job(s) of kind %s", schedule.name, jobs, schedule.kind)
        # Next look when the database's clock reaches the next tick, on this host's clock.
        wait = (schedule.next_tick(seen[-1]) - seen[-1]).total_seconds()
        self._asked[schedule.name] = (now, now + min(wait, self.MAX_WAIT_S))
        return jobs
