"""The dashboard names queued kinds no live worker handles, with their count and how long
the oldest has waited, on the page and its live fragment; real subprocess, real PostgreSQL."""

from __future__ import annotations

import httpx

from tests.dashboard.conftest import Dashboard
from tests.helpers import enqueue, execute


def test_overview_names_kinds_no_live_worker_handles(pg_dsn: str, dashboard: Dashboard) -> None:
    enqueue(pg_dsn, "cuont", 3)
    enqueue(pg_dsn, "count", 2)
    enqueue(pg_dsn, "count", 1, queue="bulk")
    execute(pg_dsn, "UPDATE shardworker.jobs SET run_at = now() - interval '3 hours' WHERE kind = 'cuont'")
    execute(pg_dsn, "INSERT INTO shardworker.workers (worker_id, hostname, pid, heartbeat_at, kinds, queues, "
                    "rescue_after_s) VALUES ('w-1', 'host-a', 42, now(), '{count}', '{default}', 3600)")
    html = httpx.get(dashboard.url).text
    assert 'data-unserved="default/cuont"' in html and 'data-unserved="bulk/count"' in html
    assert 'data-unserved-count="default/cuont">3<' in html
    assert 'data-unserved-oldest="default/cuont">3h<' in html
    assert 'data-unserved="default/count"' not in html
    fragment = httpx.get(f"{dashboard.url}/live/overview").text
    assert 'data-unserved="default/cuont"' in fragment
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'done' WHERE kind = 'cuont' OR queue = 'bulk'")
    assert "data-unserved=" not in httpx.get(dashboard.url).text
