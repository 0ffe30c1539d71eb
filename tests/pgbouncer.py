"""A real PgBouncer in transaction mode in front of a test's database, started like the
embedded PostgreSQL: its config in a temporary directory, a free port on 127.0.0.1, and
stopped afterwards. Clients authenticate to it with SCRAM against a userlist holding the
upstream server's own user and password (taken from the DSN), which PgBouncer then uses
to log in upstream. Tests are skipped with the reason when the binary is missing
(Debian's ``pgbouncer`` package; ``.ci/run`` installs it)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

START_TIMEOUT_S = 10.0


def pgbouncer_binary() -> str:
    """The pgbouncer executable, or skip the test saying why."""
    found = shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None)
    if found is None:
        pytest.skip("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
    return found


def _config(upstream: dict[str, str], port: int, workdir: Path) -> str:
    return (
        "[databases]\n"
        f"* = host={upstream['host']} port={upstream['port']}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\n"
        f"unix_socket_dir = {workdir}\n"
        "auth_type = scram-sha-256\n"
        f"auth_file = {workdir / 'userlist.txt'}\n"
        "pool_mode = transaction\n"
        "max_client_conn = 200\ndefault_pool_size = 20\n"
        f"logfile = {workdir / 'pgbouncer.log'}\n"
        f"pidfile = {workdir / 'pgbouncer.pid'}\n"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"pgbouncer exited ({proc.returncode}):\n{log.read_text(errors='replace')}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"pgbouncer did not listen on {port} within {START_TIMEOUT_S}s")


def _as_unprivileged(workdir: Path) -> list[str]:
    """PgBouncer refuses to run as root: as root, run it as ``nobody``, owning its directory."""
    if os.geteuid() != 0:
        return []
    nobody = pwd.getpwnam("nobody")
    for path in (workdir, *workdir.iterdir()):
        os.chown(path, nobody.pw_uid, nobody.pw_gid)
    return ["-u", "nobody"]


@contextlib.contextmanager
def pgbouncer(upstream_dsn: str) -> Iterator[str]:
    """Run PgBouncer (transaction pooling) in front of ``upstream_dsn``; yield the DSN that
    reaches the same database through it."""
    binary = pgbouncer_binary()
    upstream = conninfo_to_dict(upstream_dsn)
    port = _free_port()
    workdir = Path(tempfile.mkdtemp(prefix="shardworker-pgbouncer-"))
    try:
        (workdir / "userlist.txt").write_text(f'"{upstream["user"]}" "{upstream["password"]}"\n')
        (workdir / "pgbouncer.ini").write_text(_config(upstream, port, workdir))
        os.chmod(workdir, 0o700)
        cmd = [binary, *_as_unprivileged(workdir), str(workdir / "pgbouncer.ini")]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            _wait_listening(port, proc, workdir / "pgbouncer.log")
            yield make_conninfo(upstream_dsn, host="127.0.0.1", port=str(port))
        finally:
            proc.terminate()
            proc.wait(10)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
