"""The dashboard through a database outage: its own server stopped for real under a running
dashboard. The pages keep the last data they read, greyed and dated, under one banner, and
each worker's outbox backlog as last known; the database back, they are live again."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from shardworker.embedded import EmbeddedPostgres
from tests.dashboard.conftest import running_dashboard
from tests.helpers import enqueue, execute

DATA_TIME = re.compile(r"data read at \d\d:\d\d:\d\d UTC")


def busy(dsn: str) -> int:
    """Three jobs queued in `media`, a job to show, and a live worker with 867 outcomes in its outbox."""
    [job_id, *_] = enqueue(dsn, "thumbnail", 3, queue="media")
    execute(dsn, "INSERT INTO shardworker.workers (worker_id, hostname, pid, heartbeat_at, outbox_pending) "
                 "VALUES ('w-outage', 'host-a', 4242, now(), 867)")
    return job_id


def test_an_outage_keeps_the_last_data_greyed_under_one_banner(private_pg: EmbeddedPostgres, tmp_path: Path) -> None:
    job_id = busy(private_pg.dsn)
    with running_dashboard(private_pg.dsn, tmp_path) as board:
        before = httpx.get(board.url + "/live/overview", timeout=15)
        assert before.status_code == 200 and "data-stale" not in before.text
        assert httpx.get(f"{board.url}/jobs/{job_id}", timeout=15).status_code == 200
        private_pg.stop("immediate")
        for path in ("/", "/live/overview"):
            during = httpx.get(board.url + path, timeout=15)
            assert during.status_code == 503, during.text
            assert re.search(r'data-count="media/available">\s*3<', during.text), during.text  # the last counts
            assert re.search(r'data-pending="w-outage">867<', during.text)  # the worker's outbox, as last known
            assert "data-stale" in during.text and DATA_TIME.search(during.text), during.text
            assert during.text.lower().count("database unavailable") == 1, during.text
            assert during.text.count("data-banner") == 1
        job_page = httpx.get(f"{board.url}/live/jobs/{job_id}", timeout=15)
        assert job_page.status_code == 503 and "data-job-status" in job_page.text and "data-stale" in job_page.text
        private_pg.start()
        after = httpx.get(board.url + "/live/overview", timeout=15)
        assert after.status_code == 200 and "data-stale" not in after.text and "data-banner" not in after.text
