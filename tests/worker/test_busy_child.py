"""A busy child never hoards jobs another child could start: real worker processes on a real
PostgreSQL, one handler holding its child's only lane (no timeout), handlers counting their
own runs in an fsync'd ledger."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.helpers import enqueue, exit_code, query, runs, start_worker, status_counts, wait_for


def statuses(dsn: str, kind: str) -> dict[str, int]:
    return {s: n for s, n in query(dsn, "SELECT status, count(*) FROM shardworker.jobs WHERE kind = %s "
                                        "GROUP BY status", kind)}


@pytest.mark.parametrize(("hog", "quick", "args"), [
    ("hog", "quick", ()),
    ("hog_async", "quick_async", ("--concurrency", "1")),
], ids=["sync", "async"])
def test_jobs_never_wait_behind_a_handler_that_holds_its_child(
        pg_dsn: str, tmp_path: Path, hog: str, quick: str, args: tuple[str, ...]) -> None:
    """With --procs 2 and one handler that runs for a minute (no timeout), 200 quick jobs
    enqueued after it all finish within 15 s while it still runs; after SIGTERM, nothing ran twice."""
    count_dir = tmp_path / "counts"
    count_dir.mkdir()
    [hog_id] = enqueue(pg_dsn, hog, 1, {"sleep": 60})
    quick_ids = enqueue(pg_dsn, quick, 200)
    proc = start_worker(pg_dsn, tmp_path / "outbox", count_dir, "--shutdown-timeout", "2", *args,
                        app="busy_app")
    wait_for(lambda: (hog_id, 1) in runs(count_dir), 30, "the hog to start")
    wait_for(lambda: statuses(pg_dsn, quick).get("done") == 200, 15, "the 200 quick jobs to be done")
    assert query(pg_dsn, "SELECT status FROM shardworker.jobs WHERE id = %s", hog_id) == [("running",)]
    proc.send_signal(signal.SIGTERM)
    assert exit_code(proc, 30, count_dir) == 0
    ran = runs(count_dir)
    assert {key: n for key, n in ran.items() if n > 1} == {}  # nothing ran twice
    assert sorted(i for i, _ in ran if i != hog_id) == quick_ids  # each quick job ran, once
    assert status_counts(pg_dsn).get("done") == 200
