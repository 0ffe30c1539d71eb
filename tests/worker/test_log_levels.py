"""The worker's log at its default level: shardworker's own lines and the app's at INFO, and a
chatty library's (httpx, which logs each request at INFO) only from WARNING, so an HTTP client
in a handler does not print a line per request."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import enqueue, run_until_idle, worker_log


def test_other_libraries_info_lines_stay_out_of_the_worker_log(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    enqueue(pg_dsn, "fetch", 2)
    assert run_until_idle(pg_dsn, dirs, app="logging_app") == 0
    log = worker_log(dirs[1])
    assert "fetched for job 1" in log and "fetched for job 2" in log  # the app's own INFO
    assert "a module of another package, job 1" in log  # handlers' modules anywhere
    assert "retrying a slow request for job 1" in log  # a library's WARNING
    assert "HTTP Request: GET" not in log  # a library's INFO
    assert "ready: claiming fetch" in log  # shardworker's INFO
