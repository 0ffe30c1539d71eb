"""A job's page on the dashboard lists its failed attempts (the ``errors`` history a worker
keeps: attempt, when, error, traceback), oldest first, escaped; a job that never failed has
no such list."""

from __future__ import annotations

import httpx

from tests.dashboard.conftest import Dashboard
from tests.helpers import enqueue, execute


def test_job_page_lists_each_failed_attempt_with_its_traceback(pg_dsn: str, dashboard: Dashboard) -> None:
    failed, fine = enqueue(pg_dsn, "count", 2)
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'failed', attempt = 2, max_attempts = 2, "
                    "last_error = 'ValueError: <two>', errors = %s::jsonb WHERE id = %s",
            '[{"attempt": 1, "at": "2030-01-02T03:04:05.000000+00:00", "error": "ValueError: <one>",'
            ' "traceback": "Traceback (most recent call last):\\n  File \\"tasks.py\\", line 9, in handler\\n'
            'ValueError: <one>"},'
            ' {"attempt": 2, "at": "2030-01-02T03:05:05.000000+00:00", "error": "timed out after 5s",'
            ' "traceback": null}]', failed)
    for path in (f"/jobs/{failed}", f"/live/jobs/{failed}"):
        html = httpx.get(dashboard.url + path).text
        assert html.count("<tr data-error>") == 2 and "Errors (2 failed attempts)" in html
        assert html.index("ValueError: &lt;one&gt;") < html.index("timed out after 5s")
        assert "2030-01-02 03:04:05 UTC" in html and 'File &#34;tasks.py&#34;, line 9, in handler' in html
    assert "data-errors" not in httpx.get(f"{dashboard.url}/jobs/{fine}").text
