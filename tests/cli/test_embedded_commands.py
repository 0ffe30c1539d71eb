"""The `shardworker embedded` commands from a project directory, and the commands that use the
embedded server without --dsn: those that write start it, those that only read never do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psycopg

from shardworker.embedded import EmbeddedPostgres

REPO = Path(__file__).resolve().parents[2]


def _console(project: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run `shardworker ARGS` in ``project`` with no DSN in the environment."""
    env = {**{k: v for k, v in os.environ.items() if k != "SHARDWORKER_DSN"}, "PYTHONPATH": str(REPO)}

    def sw(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "shardworker", *args], cwd=project, env=env,
                              capture_output=True, text=True, timeout=120)
    return sw


def _select_one(dsn: str) -> int:
    with psycopg.connect(dsn, connect_timeout=5) as conn:
        row = conn.execute("select 1").fetchone()
    return int(row[0]) if row else 0


def test_embedded_status_and_stop_through_the_command_line(tmp_path: Path) -> None:
    """`shardworker embedded status|stop` from a project directory: none yet (exit 1), running
    after a command created it, stopped (exit 1), and started again by the next command."""
    sw = _console(tmp_path)
    none = sw("embedded", "status")
    assert none.returncode == 1 and none.stdout.startswith("no embedded PostgreSQL in .shardworker/pgdata")
    try:
        assert sw("enqueue", "note").returncode == 0  # a command that writes creates and starts it
        running = json.loads(sw("embedded", "status", "--json").stdout)
        assert running["running"] and isinstance(running["port"], int)
        assert sw("embedded", "stop").stdout == "stopped the embedded PostgreSQL in .shardworker/pgdata\n"
        stopped = sw("embedded", "status")
        assert stopped.returncode == 1 and stopped.stdout.endswith(": stopped\n")
        assert sw("enqueue", "note").returncode == 0  # started again, on the same port
        assert json.loads(sw("embedded", "status", "--json").stdout)["port"] == running["port"]
    finally:
        sw("embedded", "stop")


def test_embedded_start_and_dsn_and_readers_that_never_start_it(tmp_path: Path) -> None:
    """`embedded start` creates, starts and migrates the server; `embedded dsn` prints a DSN that
    connects, stopped or not; `stats`, `doctor` and the other commands that only read (jobs list,
    show and wait, queues, workers, periodic) on a stopped server say so, with how to start it,
    and leave it stopped."""
    sw = _console(tmp_path)
    datadir = tmp_path / ".shardworker" / "pgdata"
    try:
        nothing = sw("stats")
        assert (nothing.returncode, nothing.stdout) == (1, "")
        assert nothing.stderr == ("error: no embedded PostgreSQL in .shardworker/pgdata: `shardworker embedded "
                                  "start` creates one (or give --dsn)\n")
        assert sw("embedded", "dsn").returncode == 1
        started = sw("embedded", "start")
        assert started.returncode == 0, started.stderr
        server = EmbeddedPostgres(datadir)  # its port is the one the start saved
        assert started.stdout == f"embedded PostgreSQL in .shardworker/pgdata running on 127.0.0.1:{server.port}\n"
        dsn = sw("embedded", "dsn").stdout.strip()
        assert _select_one(dsn) == 1 and dsn == server.dsn
        assert "available=0" in sw("stats").stdout  # migrated: stats reads the schema
        sw("embedded", "stop")
        stopped = sw("stats")
        assert (stopped.returncode, stopped.stdout) == (1, "")
        assert stopped.stderr == ("error: the embedded PostgreSQL in .shardworker/pgdata is stopped: "
                                  "`shardworker embedded start` starts it (or give --dsn)\n")
        for reader in (["jobs", "list"], ["jobs", "show", "1"], ["jobs", "wait", "1", "--timeout", "1"], ["queues"],
                       ["workers"], ["periodic"]):
            read = sw(*reader)
            assert read.returncode == 1 and read.stderr.endswith("is stopped: `shardworker embedded start` starts "
                                                                 "it (or give --dsn)\n"), (reader, read.stderr)
            assert not server.is_running(), reader
        doctor = sw("doctor", "--json")
        [database] = [c for c in json.loads(doctor.stdout)["checks"] if c["check"] == "database"]
        assert doctor.returncode == 1 and database["status"] == "fail", doctor.stdout
        assert "is stopped" in database["detail"] and "shardworker embedded start" in database["action"]
        assert not server.is_running()
        still = sw("embedded", "dsn")
        assert (still.stdout.strip(), still.returncode) == (dsn, 0)
        assert "stopped" in still.stderr
        assert sw("embedded", "start").returncode == 0 and _select_one(dsn) == 1  # the same DSN again
    finally:
        EmbeddedPostgres(datadir).stop("immediate")
