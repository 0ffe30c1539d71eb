"""``shardworker.asgi`` in a FastAPI app served by uvicorn (a real subprocess) beside a real
worker, driven with httpx: the order and its job commit together or not at all, a route awaits
the job's end, another streams its progress and status as server-sent events."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port
from tests.helpers import APPS_DIR, REPO, execute, exit_code, query, runs_per_job, start_worker

pytest.importorskip("fastapi")
pytest.importorskip("psycopg_pool")


@pytest.fixture
def shop(pg_dsn: str, tmp_path: Path) -> Iterator[str]:
    """The shop's web app on a free port; its URL."""
    execute(pg_dsn, "CREATE TABLE orders (id serial PRIMARY KEY, email text NOT NULL)")
    port = free_port()
    env = {**os.environ, "SHOP_DSN": pg_dsn,
           "PYTHONPATH": os.pathsep.join([str(APPS_DIR), str(REPO), os.environ.get("PYTHONPATH", "")])}
    log = (tmp_path / "web.log").open("wb")
    web = subprocess.Popen([sys.executable, "-m", "uvicorn", "shop_web:app", "--host", "127.0.0.1", "--port",
                            str(port)], env=env, stdout=log, stderr=log, cwd=tmp_path)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert web.poll() is None, (tmp_path / "web.log").read_text()
        time.sleep(0.1)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        web.terminate()
        web.wait(10)


def events(response: httpx.Response) -> list[tuple[str, str]]:
    """(event, data) of each server-sent event, as they come."""
    found, name = [], ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            found.append((name, line[len("data: "):]))
    return found


def test_an_order_and_its_job_commit_together_and_the_browser_follows_it(
        pg_dsn: str, dirs: tuple[Path, Path], shop: str) -> None:
    outbox_dir, count_dir = dirs
    failed = httpx.post(f"{shop}/orders", params={"email": "x@example.com", "fail": "true"}, timeout=30)
    assert failed.status_code == 500
    assert httpx.post(f"{shop}/reminders", params={"email": "y@example.com"}, timeout=30).status_code == 500
    assert query(pg_dsn, "SELECT count(*) FROM orders") == [(0,)]
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs") == [(0,)]  # rolled back with the order
    made = httpx.post(f"{shop}/orders", params={"email": "ana@example.com"}, timeout=30).json()
    waiting = httpx.get(f"{shop}/jobs/{made['job']}/result", params={"timeout": 0.5}, timeout=30)
    assert waiting.status_code == 504  # no worker yet
    proc = start_worker(pg_dsn, outbox_dir, count_dir, procs=1, app="shop_worker")
    try:
        with httpx.stream("GET", f"{shop}/jobs/{made['job']}/events", timeout=60) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            seen = events(response)
        result = httpx.get(f"{shop}/jobs/{made['job']}/result", timeout=30).json()
    finally:
        proc.terminate()
        exit_code(proc, 30, count_dir)
    names = [name for name, _ in seen]
    assert names[0] == "status" and names[-1] == "end" and "progress" in names
    assert '"page":3' in [data for name, data in seen if name == "progress"][-1]
    assert '"status":"done"' in seen[-1][1] and '"sent_to":"ana@example.com"' in seen[-1][1]
    assert result == {"status": "done", "result": {"sent_to": "ana@example.com"}}
    assert query(pg_dsn, "SELECT id, email FROM orders") == [(made["order"], "ana@example.com")]
    assert runs_per_job(count_dir) == {made["job"]: 1}
