"""A running worker's heartbeat reports, per queue and kind, the jobs it claimed and has not
started (prefetched) apart from those whose handler started (running), and the backlog
counts them so: a real worker process on a real PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardworker.store.pg_store import PgStore, StoreConfig
from tests.helpers import enqueue, kill_worker_group, query, start_worker, wait_for


def flow_and_claimed(dsn: str) -> tuple[dict[tuple[str, str], tuple[int, int]], dict[tuple[str, str], int]]:
    """(the worker's last flow report by (queue, kind), its claimed jobs by (queue, kind))."""
    reports = query(dsn, "SELECT flow FROM shardworker.workers")  # none before the first beat
    report = reports[0][0] if reports else None
    claimed = query(dsn, "SELECT queue, kind, count(*) FROM shardworker.jobs WHERE status = 'running' "
                         "GROUP BY queue, kind")
    return ({(q, k): (p, r) for q, k, p, r in report or []}, {(q, k): int(n) for q, k, n in claimed})


def test_the_heartbeat_reports_prefetched_apart_from_running(pg_dsn: str, tmp_path: Path) -> None:
    """One child running one sync handler at a time, ten-minute jobs in two queues: the report
    says one running and every other claimed job prefetched, and the backlog agrees."""
    count_dir = tmp_path / "counts"
    count_dir.mkdir()
    enqueue(pg_dsn, "sleepy", 5, {"sleep": 600})
    enqueue(pg_dsn, "sleepy", 2, {"sleep": 600}, queue="other")
    proc = start_worker(pg_dsn, tmp_path / "outbox", count_dir, "--concurrency", "1", procs=1)
    seen: dict[str, Any] = {}

    def settled() -> bool:
        report, claimed = flow_and_claimed(pg_dsn)
        seen.update(report=report, claimed=claimed)
        return (sum(r for _, r in report.values()) == 1 and sum(claimed.values()) >= 2
                and {key: p + r for key, (p, r) in report.items() if p + r} == claimed)

    try:
        wait_for(settled, 60, "a flow report of one running job and the rest prefetched")
        report, claimed = seen["report"], seen["claimed"]
        store = PgStore(StoreConfig(dsn=pg_dsn))
        try:
            backlog = {(row.queue, row.kind): row for row in store.backlog()}
        finally:
            store.close()
        for key, (prefetched, running) in report.items():
            row = backlog[key]
            assert (row.prefetched, row.running) == (prefetched, running), (row, report)
            assert row.available == {"default": 5, "other": 2}[key[0]] - claimed.get(key, 0)
    finally:
        kill_worker_group(proc)
