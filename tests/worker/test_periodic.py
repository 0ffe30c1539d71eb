"""Periodic jobs: the schedule's arithmetic, and ticks enqueued once across two workers, a
restart and a time with no worker at all, on a real PostgreSQL."""

from __future__ import annotations

import itertools
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from shardworker import App
from shardworker.core.schedule import Schedule
from shardworker.errors import ConfigError
from tests.helpers import exit_code, query, runs_per_job, start_worker

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def test_first_sight_starts_with_the_next_tick_and_later_every_tick_is_planned_once() -> None:
    every5 = Schedule("*/5 * * * *", "report", '{"a": 1}')
    jobs, last = every5.plan(T0 + timedelta(minutes=3), None)
    assert (jobs, last) == ([], T0)
    jobs, last = every5.plan(T0 + timedelta(minutes=17), last)
    assert [j["run_at"] for j in jobs] == [T0 + timedelta(minutes=m) for m in (5, 10, 15)]
    assert last == T0 + timedelta(minutes=15)
    assert jobs[0]["dedupe_key"] == "periodic:report:2026-03-01T12:05:00+00:00"
    assert {(j["kind"], j["payload_json"]) for j in jobs} == {("report", '{"a": 1}')}
    assert every5.plan(T0 + timedelta(minutes=19), last) == ([], last)
    jobs, _ = every5.plan(T0 + timedelta(minutes=20), last)  # a tick exactly now is due
    assert [j["run_at"] for j in jobs] == [T0 + timedelta(minutes=20)]


def test_catch_up_bounds_a_long_gap_to_the_latest_ticks() -> None:
    every_minute = Schedule("* * * * *", "k", catch_up=3)
    jobs, last = every_minute.plan(T0 + timedelta(hours=2), T0)
    assert [j["run_at"] for j in jobs] == [T0 + timedelta(minutes=m) for m in (118, 119, 120)]
    assert last == T0 + timedelta(hours=2)


def test_time_zones_follow_local_time() -> None:
    daily = Schedule("0 9 * * *", "k", tz="Europe/Paris")
    jobs, _ = daily.plan(datetime(2026, 7, 2, 8, 0, tzinfo=UTC), datetime(2026, 7, 1, 8, 0, tzinfo=UTC))
    assert [j["run_at"].astimezone(UTC) for j in jobs] == [datetime(2026, 7, 2, 7, 0, tzinfo=UTC)]  # 9:00 CEST


@pytest.mark.parametrize("kwargs, message", [
    ({"cron": "every day", "kind": "k"}, "not a cron expression"),
    ({"cron": "61 * * * *", "kind": "k"}, "not a cron expression"),
    ({"cron": "* * * * *", "kind": ""}, "kind"),
    ({"cron": "* * * * *", "kind": "k", "tz": "Mars/Olympus"}, "unknown time zone"),
    ({"cron": "* * * * *", "kind": "k", "catch_up": 0}, "catch_up"),
])
def test_bad_schedules_are_refused_in_one_line(kwargs: dict[str, object], message: str) -> None:
    app = App()
    cron = kwargs.pop("cron")
    with pytest.raises(ConfigError, match=message):
        app.periodic(cron, **kwargs)  # type: ignore[arg-type]


def test_a_schedule_name_is_used_once_and_payloads_must_be_json() -> None:
    app = App()
    app.periodic("* * * * *", kind="k")
    with pytest.raises(ConfigError, match="scheduled twice"):
        app.periodic("*/2 * * * *", kind="k")
    app.periodic("*/2 * * * *", kind="k", name="k-fast")
    with pytest.raises(ConfigError, match="not JSON-serializable"):
        app.periodic("* * * * *", kind="other", payload={1, 2})


def ticks(dsn: str, name: str) -> list[datetime]:
    prefix = f"periodic:{name}:"
    rows = query(dsn, "SELECT dedupe_key FROM shardworker.jobs WHERE dedupe_key LIKE %s", prefix + "%")
    return sorted(datetime.fromisoformat(key.removeprefix(prefix)) for (key,) in rows)


def test_each_tick_is_enqueued_once_across_two_workers_a_restart_and_a_gap(pg_dsn: str, tmp_path: Path) -> None:
    count_dir = tmp_path / "count"
    count_dir.mkdir()

    def worker(name: str, *extra: str) -> object:
        return start_worker(pg_dsn, tmp_path / f"outbox-{name}", count_dir, "--app", "periodic_app", *extra,
                            procs=1)

    a, b = worker("a"), worker("b")
    time.sleep(5)
    b.send_signal(signal.SIGTERM)
    assert exit_code(b, 30, count_dir) == 0
    time.sleep(2)
    a.send_signal(signal.SIGTERM)  # no worker at all for a while: its ticks are caught up later
    assert exit_code(a, 30, count_dir) == 0
    stopped_at = datetime.now(UTC)
    time.sleep(3)
    a = worker("a")
    time.sleep(4)
    a.send_signal(signal.SIGTERM)
    assert exit_code(a, 30, count_dir) == 0
    drain_started = datetime.now(UTC) - timedelta(seconds=2)  # its catch-up covers the last stop too
    drain = worker("a", "--exit-when-idle")
    assert exit_code(drain, 60, count_dir) == 0

    every_second = ticks(pg_dsn, "tick")
    assert len(every_second) >= 8, every_second
    assert len(set(every_second)) == len(every_second), "a tick was enqueued twice"
    expected = [every_second[0] + timedelta(seconds=i) for i in range(len(every_second))]
    assert every_second == expected, "a tick was skipped"
    assert any(stopped_at < t < stopped_at + timedelta(seconds=3) for t in every_second), \
        "the ticks of the time without a worker were not caught up"
    every_two = ticks(pg_dsn, "tick-every-2s")
    assert len(set(every_two)) == len(every_two) >= 4
    assert all(t.second % 2 == 0 for t in every_two), every_two
    assert [(b - a).total_seconds() for a, b in itertools.pairwise(every_two)] == [2.0] * (len(every_two) - 1)

    assert_each_tick_ran_once(pg_dsn, count_dir, drain_started)


def assert_each_tick_ran_once(pg_dsn: str, count_dir: Path, drain_started: datetime) -> None:
    """Every tick's job ran once, at its tick, from its schedule; only the draining worker's own
    catch-up may still wait."""
    rows = query(pg_dsn, "SELECT id, status, payload, run_at, dedupe_key FROM shardworker.jobs")
    # The draining worker runs the schedules too: only ticks it enqueued (catching up from
    # the last stop) may still wait.
    waiting = [r for r in rows if r[1] != "done"]
    assert all(r[1] == "queued" and r[3] >= drain_started for r in waiting), \
        (drain_started, waiting)
    rows = [r for r in rows if r[1] == "done"]
    assert {(r[2]["from"], r[4].startswith("periodic:tick-every-2s:")) for r in rows} == {("cron", False),
                                                                                          ("cron2", True)}
    assert all(r[3] == datetime.fromisoformat(r[4].split(":", 2)[2]) for r in rows), "run_at is the tick"
    per_job = runs_per_job(count_dir)
    assert {r[0] for r in rows} <= set(per_job) and set(per_job.values()) == {1}
    assert [r[0] for r in query(pg_dsn, "SELECT name FROM shardworker.periodic ORDER BY name")] == \
        ["tick", "tick-every-2s"]
