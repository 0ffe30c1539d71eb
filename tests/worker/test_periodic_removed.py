"""A periodic schedule removed from the code: once no worker has checked it for a day, it is
gone from `shardworker periodic` and its row is forgotten by a worker's housekeeping; one
checked within the day stays. And a worker does not log a line for every tick."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers import execute, exit_code, query, start_worker, wait_for, worker_env, worker_log


def _schedules(dsn: str, count_dir: Path) -> list[str]:
    """The names `shardworker periodic --json` lists."""
    listed = subprocess.run([sys.executable, "-m", "shardworker", "periodic", "--json", "--dsn", dsn],
                            env=worker_env(count_dir), capture_output=True, text=True, timeout=60, check=True)
    return [s["name"] for s in json.loads(listed.stdout)]


def test_a_schedule_no_worker_checks_for_a_day_is_forgotten(pg_dsn: str, tmp_path: Path) -> None:
    count_dir = tmp_path / "count"
    count_dir.mkdir()
    execute(pg_dsn, "INSERT INTO shardworker.periodic (name, schedule, last_tick, updated_at) VALUES "
                    "('removed', '0 * * * *', now() - interval '25 hours', now() - interval '25 hours'), "
                    "('idle-an-hour', '0 * * * *', now() - interval '1 hour', now() - interval '1 hour')")
    assert _schedules(pg_dsn, count_dir) == ["idle-an-hour"]  # no worker yet: the listing already hides it

    worker = start_worker(pg_dsn, tmp_path / "outbox", count_dir, "--app", "periodic_app", procs=1)
    wait_for(lambda: query(pg_dsn, "SELECT count(*) FROM shardworker.periodic WHERE name = 'removed'") == [(0,)],
             60, "the removed schedule's row forgotten")
    wait_for(lambda: query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE status = 'done'")[0][0] >= 3, 30,
             "ticks run")
    worker.send_signal(signal.SIGTERM)
    assert exit_code(worker, 30, count_dir) == 0
    assert _schedules(pg_dsn, count_dir) == ["idle-an-hour", "tick", "tick-every-2s"]
    log = worker_log(count_dir)
    assert "forgot periodic schedule 'removed': no worker has checked it for 1d" in log, log
    assert "periodic tick: enqueued" not in log, log  # each tick is a debug line, not info
