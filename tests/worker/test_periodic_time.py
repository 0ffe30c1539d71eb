"""Periodic ticks once per scheduled instant: across the DST changes of the schedule's time
zone, with explicit instants, through the real store, and whatever this host's clock does."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from shardworker.core.schedule import Schedule
from shardworker.store.pg_store import PgStore, StoreConfig
from shardworker.worker.periodic import Scheduler
from tests.helpers import execute, query


def walk(schedule: Schedule, start: datetime, end: datetime, step: timedelta) -> list[datetime]:
    """Every tick enqueued by a worker that asks at each ``step`` from ``start`` to ``end``."""
    last = schedule.plan(start, None)[1]
    now, enqueued = start, []
    while now <= end:
        jobs, last = schedule.plan(now, last)
        enqueued += [job["run_at"] for job in jobs]
        now += step
    return enqueued


@pytest.mark.parametrize("cron, tz, day", [
    ("30 2 * * *", "Europe/Paris", datetime(2024, 10, 27)),
    ("0 1 * * *", "America/New_York", datetime(2024, 11, 3)),
    ("30 1 * * *", "America/New_York", datetime(2024, 11, 3)),
])
@pytest.mark.parametrize("step", [timedelta(minutes=1), timedelta(minutes=20), timedelta(hours=5)])
def test_a_daily_schedule_ticks_once_on_the_fall_back_day(cron: str, tz: str, day: datetime,
                                                           step: timedelta) -> None:
    schedule = Schedule(cron, "daily", tz=tz)
    start = (day - timedelta(days=1)).replace(hour=12, tzinfo=UTC)
    enqueued = walk(schedule, start, start + timedelta(days=3), step)
    local_days = Counter(tick.astimezone(ZoneInfo(tz)).date() for tick in enqueued)
    assert local_days == Counter({(day + timedelta(days=d)).date(): 1 for d in range(3)}), enqueued
    # The repeated wall-clock time runs at its first occurrence (summer time).
    fall_back = next(t.astimezone(ZoneInfo(tz)) for t in enqueued if t.astimezone(ZoneInfo(tz)).date() == day.date())
    assert fall_back.dst()


def test_the_fall_back_tick_is_not_planned_again_after_its_first_occurrence() -> None:
    schedule = Schedule("30 1 * * *", "daily", tz="America/New_York")
    first = datetime(2024, 11, 3, 5, 30, tzinfo=UTC)  # 01:30 EDT
    assert schedule.ticks_after(first, first + timedelta(hours=3)) == []
    jobs, last = schedule.plan(first + timedelta(hours=1, minutes=5), first)  # 01:35 EST
    assert (jobs, last) == ([], first)


def test_spring_forward_runs_a_skipped_time_once_at_the_jump() -> None:
    schedule = Schedule("30 2 * * *", "daily", tz="Europe/Paris")
    start = datetime(2024, 3, 30, 12, tzinfo=UTC)
    enqueued = walk(schedule, start, start + timedelta(days=2), timedelta(minutes=7))
    assert enqueued == [datetime(2024, 3, 31, 1, 0, tzinfo=UTC),  # 03:00 CEST, the jump
                        datetime(2024, 4, 1, 0, 30, tzinfo=UTC)]  # 02:30 CEST
    both = Schedule("0 2,3 * * *", "k", tz="Europe/Paris")  # 02:00 and 03:00 are one instant that day
    assert both.ticks_after(start, start + timedelta(days=1)) == [datetime(2024, 3, 31, 1, 0, tzinfo=UTC)]


def test_an_hourly_schedule_ticks_every_real_hour_through_the_repeated_hour() -> None:
    schedule = Schedule("0 * * * *", "hourly", tz="America/New_York")
    start = datetime(2024, 11, 3, 4, 0, tzinfo=UTC)  # midnight EDT
    ticks = schedule.ticks_after(start, start + timedelta(hours=5))
    assert ticks == [start + timedelta(hours=h) for h in range(1, 6)]  # 01:00 EDT, 01:00 EST, 02:00 ...


class FakeDbStore:
    """``run_periodic`` on a database clock the test moves."""

    def __init__(self, db_now: datetime) -> None:
        self.db_now = db_now
        self.last: datetime | None = None
        self.enqueued: list[datetime] = []
        self.asked = 0

    def run_periodic(self, name: str, schedule: str, plan: Any) -> int:
        self.asked += 1
        jobs, self.last = plan(self.db_now, self.last)
        self.enqueued += [job["run_at"] for job in jobs]
        return len(jobs)


def test_a_backward_step_of_this_hosts_clock_does_not_silence_the_schedule() -> None:
    host = [1_000_000.0]
    t0 = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)
    store = FakeDbStore(t0)
    scheduler = Scheduler(store, [Schedule("* * * * *", "k")], clock=lambda: host[0])
    scheduler.run_once()  # first sight
    host[0] -= 3600.0  # the host's clock is stepped back an hour; the database's is right
    for second in range(1, 181):
        host[0] += 1.0
        store.db_now = t0 + timedelta(seconds=second)
        scheduler.run_once()
    assert store.enqueued[:2] == [datetime(2026, 3, 1, 12, m, tzinfo=UTC) for m in (1, 2)], store.enqueued
    assert store.asked < 20, "the scheduler should not ask the database every second"


def test_ticks_across_two_years_of_dst_changes_through_the_real_store(pg_dsn: str) -> None:
    """The row's last tick is two years back: catching up through four DST changes enqueues
    one job per local day, and the store's dedupe keys are all distinct."""
    schedule = Schedule("30 2 * * *", "daily", name="paris", tz="Europe/Paris", catch_up=5000)
    execute(pg_dsn, "INSERT INTO shardworker.periodic (name, schedule, last_tick) VALUES (%s, %s, %s)",
            "paris", schedule.cron, datetime(2024, 10, 26, 0, 30, tzinfo=UTC))
    store = PgStore(StoreConfig(dsn=pg_dsn, connect_timeout_s=3, statement_timeout_s=30))
    try:
        inserted = Scheduler(store, [schedule]).run_once()
    finally:
        store.close()
    rows = query(pg_dsn, "SELECT run_at, dedupe_key FROM shardworker.jobs WHERE kind = 'daily'")
    (db_now,) = query(pg_dsn, "SELECT now()")[0]
    paris = ZoneInfo("Europe/Paris")
    days = Counter(run_at.astimezone(paris).date() for run_at, _ in rows)
    assert set(days.values()) == {1}, [d for d, n in days.items() if n > 1]
    first, last = min(days), max(days)
    assert first == datetime(2024, 10, 27).date()
    assert (db_now.astimezone(paris).date() - last).days <= 1
    assert len(days) == (last - first).days + 1 == inserted
    assert datetime(2024, 10, 27, 0, 30, tzinfo=UTC) in {run_at for run_at, _ in rows}  # 02:30 CEST
    assert datetime(2025, 3, 30, 1, 0, tzinfo=UTC) in {run_at for run_at, _ in rows}  # the jump, 03:00 CEST


@pytest.mark.parametrize("alias, hours", [("@hourly", 1), ("@daily", 24), ("@midnight", 24)])
def test_a_cron_alias_in_a_dst_time_zone_ticks_through_the_fall_back_night(alias: str, hours: int) -> None:
    """An alias (``@hourly``) in a zone with DST: the fall-back hour raised IndexError at every
    check, for good (issue 41, 4). Hourly ticks every real hour; daily once a day."""
    schedule = Schedule(alias, "tick", tz="America/New_York")
    start = datetime(2024, 11, 2, 12, tzinfo=UTC)
    enqueued = walk(schedule, start, start + timedelta(days=2), timedelta(minutes=10))
    gaps = {later - earlier for earlier, later in zip(enqueued, enqueued[1:], strict=False)}
    if hours == 1:
        assert gaps == {timedelta(hours=1)} and len(enqueued) == 48
    else:
        assert len(enqueued) == 2 and len({t.astimezone(ZoneInfo("America/New_York")).date() for t in enqueued}) == 2


class _Broken(Schedule):
    def plan(self, now: datetime, last_tick: datetime | None) -> tuple[list[dict[str, Any]], datetime]:
        raise RuntimeError("a bug in one schedule")


def test_a_failing_schedule_never_stops_the_others(pg_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """One schedule whose check raises (a bug, a library's) is logged once and skipped; the
    schedules after it still tick."""
    store = PgStore(StoreConfig(dsn=pg_dsn))
    try:
        scheduler = Scheduler(store, [_Broken("* * * * *", "bad"), Schedule("* * * * * *", "good")])
        with caplog.at_level("ERROR"):
            for _ in range(3):
                scheduler.run_once()
                scheduler._asked.clear()  # every schedule due again at once
        execute(pg_dsn, "UPDATE shardworker.periodic SET last_tick = now() - interval '3 seconds'")
        scheduler.run_once()
    finally:
        store.close()
    assert query(pg_dsn, "SELECT count(*) > 0 FROM shardworker.jobs WHERE kind = 'good'") == [(True,)]
    assert len([r for r in caplog.records if "failed its check" in r.getMessage()]) == 1
