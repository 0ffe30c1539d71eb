"""The embedded PostgreSQL server: start, crash, restart, reuse across processes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from shardworker.embedded import EmbeddedPostgres, PostgresBinariesNotFound, bin_dir, ensure_embedded

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def server(server_dir: Path) -> Iterator[EmbeddedPostgres]:
    try:
        bin_dir()
    except PostgresBinariesNotFound as exc:
        pytest.skip(str(exc))
    server = EmbeddedPostgres(server_dir / "pgdata")
    try:
        yield server
    finally:
        server.stop("immediate")


def _select_one(dsn: str) -> int:
    with psycopg.connect(dsn, connect_timeout=5) as conn:
        row = conn.execute("select 1").fetchone()
    assert row is not None
    return int(row[0])


def test_started_server_answers_on_its_dsn(server: EmbeddedPostgres) -> None:
    """A started server accepts connections as postgres on 127.0.0.1 at the advertised port."""
    server.start()
    assert server.is_running()
    assert server.dsn == f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
    assert _select_one(server.dsn) == 1


def test_immediate_stop_refuses_connections_and_restart_keeps_the_data(server: EmbeddedPostgres) -> None:
    """After an immediate stop connections fail; a restart on the same port still holds committed rows."""
    server.start()
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("create table kept (v int)")
        conn.execute("insert into kept values (42)")
    port = server.port

    server.stop("immediate")
    assert not server.is_running()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(server.dsn, connect_timeout=2)

    server.start()
    assert server.port == port
    with psycopg.connect(server.dsn) as conn:
        assert conn.execute("select v from kept").fetchall() == [(42,)]


def test_start_is_idempotent_and_stop_of_a_stopped_server_is_a_no_op(server: EmbeddedPostgres) -> None:
    """Starting a running server keeps its postmaster; stopping twice raises nothing."""
    server.start()
    pid = server.postmaster_pid()
    server.start()
    assert pid is not None
    assert server.postmaster_pid() == pid
    server.stop()
    server.stop()
    assert server.postmaster_pid() is None


def test_new_instance_reuses_the_saved_port(server: EmbeddedPostgres) -> None:
    """The port is stored next to the data directory, so another instance gets the same DSN."""
    server.start()
    server.stop()
    saved = json.loads((server.run_dir / "postgres.json").read_text())
    again = EmbeddedPostgres(server.datadir)
    assert saved == {"port": server.port}
    assert again.dsn == server.dsn


def test_stop_rejects_an_unknown_mode(server: EmbeddedPostgres) -> None:
    """Only pg_ctl's shutdown modes are accepted."""
    with pytest.raises(ValueError, match="mode"):
        server.stop("abrupt")


def test_data_dir_is_private(server: EmbeddedPostgres) -> None:
    """The cluster's directory is 0700 and its log is not readable by others."""
    server.start()
    assert stat.S_IMODE(server.datadir.stat().st_mode) == 0o700
    assert stat.S_IMODE(server.log_path.stat().st_mode) & 0o077 == 0


def test_ensure_embedded_reuses_the_server_another_process_started(server_dir: Path) -> None:
    """A second ensure_embedded, from another process, returns the same DSN and keeps the postmaster."""
    try:
        bin_dir()
    except PostgresBinariesNotFound as exc:
        pytest.skip(str(exc))
    base = server_dir / ".shardworker"
    server = EmbeddedPostgres(base / "pgdata")
    try:
        dsn = ensure_embedded(base)
        pid = server.postmaster_pid()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        code = "import sys; from shardworker.embedded import ensure_embedded as e; print(e(sys.argv[1]))"
        other = subprocess.run(
            [sys.executable, "-c", code, str(base)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert other.stdout.strip() == dsn
        assert pid is not None
        assert server.postmaster_pid() == pid
        assert _select_one(dsn) == 1
        assert stat.S_IMODE(base.stat().st_mode) & 0o066 == 0  # 0700, or 0710 for the server's group as root
        assert stat.S_IMODE((base / "pgdata").stat().st_mode) == 0o700
    finally:
        server.stop("immediate")


def test_private_pg_fixture_survives_a_crash_and_restart(private_pg: EmbeddedPostgres) -> None:
    """The private server can be stopped immediately and restarted under the same DSN."""
    dsn = private_pg.dsn
    private_pg.stop("immediate")
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=2)
    private_pg.start()
    assert private_pg.dsn == dsn
    assert _select_one(dsn) == 1


def test_pg_dsn_is_a_fresh_database_per_test(pg_dsn: str) -> None:
    """Each test gets its own database, cloned from the template, that it may write to."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        row = conn.execute("select current_database()").fetchone()
        conn.execute("create table mine (v int)")
    assert row is not None
    assert row[0].startswith("test_")
