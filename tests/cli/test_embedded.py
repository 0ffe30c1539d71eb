"""The embedded PostgreSQL server: start, crash, restart, reuse across processes."""

from __future__ import annotations

import json
import os
import pwd
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
    password = server.password_path.read_text()
    assert server.dsn == f"postgresql://postgres:{password}@127.0.0.1:{server.port}/postgres"
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


# --- nobody else gets in ----------------------------------------------------------------------

# A stdlib-only client (any local user's python3): send a startup packet to the TCP port and say
# what the server asks for. 0 means "you are in" (trust); 10 means "prove the password" (SASL).
PROBE = r"""
import socket, struct, sys
port = int(sys.argv[1])
with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
    body = struct.pack("!I", 196608) + b"user\0postgres\0database\0postgres\0\0"
    sock.sendall(struct.pack("!I", len(body) + 4) + body)
    kind, _length, code = struct.unpack("!cII", sock.recv(9))
    print(kind.decode(), code)
try:
    open(sys.argv[2]).read()
    print("read the password")
except OSError as exc:
    print("password unreadable:", exc.strerror)
"""


def test_tcp_connections_must_know_the_password(server: EmbeddedPostgres) -> None:
    """The server does not trust TCP connections: it asks for the password (SCRAM); a wrong one fails."""
    server.start()
    probe = subprocess.run([sys.executable, "-c", PROBE, str(server.port), "/nonexistent"], capture_output=True,
                           text=True, timeout=30)
    assert probe.stdout.splitlines()[0] == "R 10", probe.stdout + probe.stderr
    wrong = server.dsn.replace(server.password_path.read_text(), "wrong-password")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(wrong, connect_timeout=5)
    assert stat.S_IMODE(server.password_path.stat().st_mode) == 0o600


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"), reason="needs root and python3")
def test_another_local_user_cannot_connect_or_read_the_password(server: EmbeddedPostgres) -> None:
    """As another local user (nobody): TCP asks for a password it cannot read, and the socket
    directory is closed to it."""
    server.start()
    probe = subprocess.run(["/usr/bin/python3", "-c", PROBE, str(server.port), str(server.password_path)],
                           capture_output=True, text=True, timeout=30, user="nobody", cwd="/")
    lines = probe.stdout.splitlines()
    assert lines[0] == "R 10", probe.stdout + probe.stderr
    assert lines[1].startswith("password unreadable"), lines
    socket_dir = server.socket_dir
    reach = subprocess.run(["/usr/bin/python3", "-c", f"import os; os.listdir({str(socket_dir)!r})"],
                           capture_output=True, text=True, timeout=30, user="nobody", cwd="/")
    assert reach.returncode != 0 and "Permission denied" in reach.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the server runs as another user only when this is root")
def test_a_private_parent_directory_stays_private(tmp_path: Path) -> None:
    """Under a 0700 directory the server still starts, and that directory gets no o+x: only the
    server's own user may search it (an ACL entry)."""
    private = tmp_path / "home"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    server = EmbeddedPostgres(private / "project" / ".shardworker" / "pgdata")
    try:
        server.start()
        assert _select_one(server.dsn) == 1
        assert stat.S_IMODE(private.stat().st_mode) & stat.S_IXOTH == 0
        listing = subprocess.run(["/usr/bin/python3", "-c", f"import os; os.listdir({str(private)!r})"],
                                 capture_output=True, text=True, timeout=30, user="nobody", cwd="/")
        assert listing.returncode != 0
    finally:
        server.stop("immediate")


@pytest.mark.skipif(os.geteuid() != 0, reason="the server runs as another user only when this is root")
def test_a_stop_reaches_the_server_after_a_chmod_of_a_parent_directory(tmp_path: Path) -> None:
    """A chmod of a parent directory while the server runs (pytest chmods /tmp/pytest-of-root
    whenever a session starts) resets the ACL mask that let the server's user search it: the
    stop grants that search again instead of failing with Permission denied."""
    private = tmp_path / "home"
    private.mkdir(mode=0o700)
    server = EmbeddedPostgres(private / "project" / ".shardworker" / "pgdata")
    try:
        server.start()
        private.chmod(0o700)
        server.stop()
        assert not server.is_running()
    finally:
        private.chmod(0o711)  # whatever happened above, the cleanup can reach the server
        server.stop("immediate")


@pytest.mark.skipif(os.geteuid() != 0, reason="creating the server's system user needs root")
def test_processes_that_start_servers_at_once_as_root_agree_on_one_system_user() -> None:
    """On a fresh machine as root (CI), the first servers start at once (one per test process)
    and each creates the system user the server runs as; all of them end with one user whose
    entry lasts, not one each where a concurrent useradd overwrote another's (its initdb then
    fails: 'could not look up effective user ID')."""
    name = f"sw-test-{os.getpid()}"
    code = ("import sys; from shardworker.embedded.programs import server_user;"
            f" print(server_user({name!r}).pw_uid)")
    try:
        procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
                 for _ in range(8)]
        uids = {int(proc.communicate(timeout=120)[0]) for proc in procs}
        assert all(proc.returncode == 0 for proc in procs)
        assert uids == {pwd.getpwnam(name).pw_uid}
    finally:
        subprocess.run(["userdel", name], capture_output=True)
