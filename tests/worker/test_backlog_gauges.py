"""The backlog gauges: per queue and kind, available, scheduled, prefetched, running and the
oldest available age, the same on every worker's /metrics, computed by one worker at a
time at most every few seconds (real workers, a real PostgreSQL)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from shardworker.store.pg_store import PgStore, StoreConfig
from tests.conftest import free_port
from tests.helpers import enqueue, execute, kill_worker_group, query, start_worker, wait_for
from tests.worker.test_observability import scrape_when_up, value


def test_a_second_store_reads_the_report_the_first_computed(pg_dsn: str) -> None:
    """Within the interval a second worker reads the last report instead of computing one."""
    enqueue(pg_dsn, "k", 3)
    first, second = (PgStore(StoreConfig(dsn=pg_dsn, connect_timeout_s=3, statement_timeout_s=5)) for _ in range(2))
    try:
        age, rows = first.backlog_report(5.0)
        assert age == 0.0 and [(r.queue, r.kind, r.available) for r in rows] == [("default", "k", 3)]
        enqueue(pg_dsn, "k", 2)
        age, rows = second.backlog_report(5.0)
        assert age > 0.0 and rows[0].available == 3  # the report, not a new count
        execute(pg_dsn, "UPDATE shardworker.backlog_report SET computed_at = now() - interval '10 s'")
        age, rows = second.backlog_report(5.0)
        assert age == 0.0 and rows[0].available == 5
    finally:
        first.close()
        second.close()


def test_two_workers_show_the_same_backlog_computed_once_per_interval(pg_dsn: str, tmp_path: Path) -> None:
    """Five long jobs running (global_concurrency=5), five waiting, three of a paused queue due,
    seven scheduled an hour ahead: both workers' gauges say so, and the report is computed
    at most every 5 s across both."""
    execute(pg_dsn, "INSERT INTO shardworker.queues (name, paused) VALUES ('uploads', true)")
    enqueue(pg_dsn, "limited", 10, {"sleep": 600})
    enqueue(pg_dsn, "thumb", 3, queue="uploads")
    later = datetime.now(UTC) + timedelta(hours=1)
    execute(pg_dsn, "INSERT INTO shardworker.jobs (kind, queue, run_at) SELECT 'thumb', 'uploads', %s "
                    "FROM generate_series(1, 7)", later)
    count_dir = tmp_path / "counts"
    count_dir.mkdir()
    ports = [free_port(), free_port()]
    workers = [start_worker(pg_dsn, tmp_path / f"outbox-{n}", count_dir, "--worker-id", f"w{n}", "--metrics-port",
                            str(port), app="flow_app", log_path=count_dir / f"w{n}.log")
               for n, port in enumerate(ports)]
    try:
        def settled(port: int) -> bool:
            samples = scrape_when_up(port)
            return value(samples, "shardworker_jobs_running", queue="default", kind="limited") == 5

        for port in ports:
            wait_for(lambda port=port: settled(port), 60, "five running in the gauges")  # type: ignore[misc]
        for port in ports:
            samples = scrape_when_up(port)
            assert value(samples, "shardworker_jobs_available", queue="default", kind="limited") == 5
            assert value(samples, "shardworker_jobs_prefetched", queue="default", kind="limited") == 0
            assert value(samples, "shardworker_jobs_available", queue="uploads", kind="thumb") == 3
            assert value(samples, "shardworker_jobs_scheduled", queue="uploads", kind="thumb") == 7
            assert value(samples, "shardworker_oldest_available_age_seconds", queue="uploads", kind="thumb",
                         waiting_on="paused") > 0
            assert value(samples, "shardworker_oldest_available_age_seconds", queue="default", kind="limited",
                         waiting_on="limit") > 0  # five wait on global_concurrency=5, not on the workers
            assert value(samples, "shardworker_limit", kind="limited", queue="", limit="global_concurrency") == 5
            assert value(samples, "shardworker_limit_in_use", kind="limited", queue="",
                         limit="global_concurrency") == 5
            assert value(samples, "shardworker_backlog_report_age_seconds") < 30
        seen = set()
        for _ in range(24):
            seen.add(query(pg_dsn, "SELECT computed_at FROM shardworker.backlog_report")[0][0])
            time.sleep(0.5)
        assert 2 <= len(seen) <= 4, f"{len(seen)} reports in 12 s"
    finally:
        for worker in workers:
            kill_worker_group(worker)
