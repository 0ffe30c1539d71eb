"""The dashboard as users run it: ``python -m shardworker dashboard`` as a real subprocess
on a free port, over the test's fresh database."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port
from tests.helpers import REPO, execute

STARTUP_TIMEOUT_S = 15.0


def fail(dsn: str, job_id: int, error: str = "ValueError: boom") -> None:
    """Make a job failed as a worker leaves it: attempts used up, the error kept."""
    execute(dsn, "UPDATE shardworker.jobs SET status = 'failed', attempt = 1, max_attempts = 1, last_error = %s, "
                 "attempted_at = now(), finished_at = now() WHERE id = %s", error, job_id)


@dataclass(frozen=True)
class Dashboard:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def token_file(self) -> Path:
        """Where it keeps the token its buttons need without --token: the default outbox
        directory, under the directory it was started in."""
        return self.log.parent / ".shardworker" / "outbox" / "dashboard-token"

    @property
    def action_token_kept(self) -> bool:
        return self.token_file.exists()

    @property
    def action_token(self) -> str:
        return self.token_file.read_text().strip()

    @property
    def acting(self) -> tuple[str, str]:
        """Basic-auth credentials that may press its buttons (httpx's ``auth=``)."""
        return ("ops", self.action_token)


def dashboard_env(token: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env.pop("SHARDWORKER_DSN", None)
    env.pop("SHARDWORKER_DASHBOARD_TOKEN", None)
    if token is not None:
        env["SHARDWORKER_DASHBOARD_TOKEN"] = token
    return env


def command(dsn: str, port: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "shardworker", "dashboard", "--port", str(port), "--dsn", dsn, *args]


@contextlib.contextmanager
def running_dashboard(dsn: str, log_dir: Path, *args: str, token: str | None = None,
                      host: str = "127.0.0.1") -> Iterator[Dashboard]:
    """Start the command, wait until it answers HTTP, stop it (SIGTERM) afterwards."""
    port = free_port()
    log = log_dir / f"dashboard-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(command(dsn, port, "--host", host, *args), env=dashboard_env(token),
                                stdout=out, stderr=out, cwd=log_dir)
    reach = "127.0.0.1" if host in ("0.0.0.0", "127.0.0.1") else host  # its own URL on another loopback address
    board = Dashboard(f"http://{reach}:{port}", proc, log)
    try:
        _wait_until_serving(board)
        yield board
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _wait_until_serving(board: Dashboard) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if board.proc.poll() is not None:
            raise AssertionError(f"dashboard exited {board.proc.returncode}:\n{board.output()}")
        with contextlib.suppress(httpx.TransportError):
            httpx.get(f"{board.url}/static/dashboard.css", timeout=1)
            return
        time.sleep(0.05)
    raise AssertionError(f"dashboard not serving after {STARTUP_TIMEOUT_S}s:\n{board.output()}")


@pytest.fixture
def dashboard(pg_dsn: str, tmp_path: Path) -> Iterator[Dashboard]:
    """The dashboard on 127.0.0.1 without a token, over ``pg_dsn``."""
    with running_dashboard(pg_dsn, tmp_path) as board:
        yield board
