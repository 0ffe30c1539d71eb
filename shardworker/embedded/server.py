"""An embedded PostgreSQL server kept in a local directory, for use without a DSN and in tests.

Layout, for ``EmbeddedPostgres("<run>/pgdata")``::

    <run>/pgdata/          the cluster (0700, owned by the server's user)
    <run>/postgres.json    {"port": N}: the port survives restarts, so the DSN stays valid
    <run>/postgres.log     server log (appended across restarts)
    <run>/postgres.lock    flock held while starting or stopping, across processes
    <run>/password         the generated password of the ``postgres`` role (0600)
    <run>/sock/            the server's unix socket directory (0700)

The server listens on 127.0.0.1 only and asks every TCP connection for the generated
password (scram-sha-256): another local user cannot connect, let alone run SQL as the
superuser. Only its own unix socket, in a 0700 directory, is trusted. PostgreSQL refuses
to run as root, so when this process is root the server runs as the system user
``shardworker-pg`` (created if missing), and each directory above the data directory and
the binaries that it could not search gets a POSIX ACL entry letting that one user search
it (never ``o+x``, which would open, say, ``/root`` to everyone).

This module drives ``initdb`` and ``pg_ctl`` and never imports psycopg. Its helpers:
``programs`` (finding and running the binaries, the server's user, the errors), ``access``
(the ACLs above) and ``state`` (the pid file, ports, state files).
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from outbox import atomic_write
from shardworker.embedded.access import chown_tree, ensure_traversable
from shardworker.embedded.programs import (
    EmbeddedNotRunning,
    EmbeddedPostgresError,
    PostgresBinariesNotFound,
    bin_dir,
    bin_dir_for,
    run_program,
    server_user,
)
from shardworker.embedded.state import (
    free_port,
    is_postgres_process,
    port_is_free,
    read_pid_file,
    tail,
    write_json,
)

STOP_MODES = ("smart", "fast", "immediate")
INITDB_OPTIONS = ("--auth=trust", "--username=postgres", "--encoding=UTF8", "--no-locale", "--no-instructions")
INITDB_TIMEOUT_S = 120.0
PG_CTL_TIMEOUT_S = 60  # pg_ctl -t: seconds to wait for start or stop
_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with the trailing NUL


class EmbeddedPostgres:
    """One PostgreSQL cluster in ``datadir``, serving on ``127.0.0.1:port``."""

    def __init__(self, datadir: str | os.PathLike[str], *, port: int | None = None) -> None:
        self.datadir = Path(datadir).absolute()
        self.run_dir = self.datadir.parent
        self.log_path = self.run_dir / "postgres.log"
        self.metadata_path = self.run_dir / "postgres.json"
        self.socket_dir = self.run_dir / "sock"
        self._port = port or self._saved_port() or free_port()

    @property
    def port(self) -> int:
        return self._port

    @property
    def password_path(self) -> Path:
        return self.run_dir / "password"

    @property
    def dsn(self) -> str:
        return self.dsn_for("postgres")

    def dsn_for(self, dbname: str) -> str:
        password = quote(self._password(), safe="")
        return f"postgresql://postgres:{password}@127.0.0.1:{self._port}/{quote(dbname, safe='')}"

    def _password(self) -> str:
        try:
            return self.password_path.read_text().strip()
        except FileNotFoundError:
            raise EmbeddedPostgresError(f"{self.password_path} is missing: start the server once "
                                        "(it generates the password)") from None

    def start(self) -> None:
        """Create the cluster if needed and start it; return once it accepts connections.

        If the server is already running, its port wins over the one this object was given.
        """
        self.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with self._lock():
            running_port = self._running_port()
            if running_port is not None:
                self._port = running_port
                return
            owner = server_user()
            bins = bin_dir_for(self.datadir)
            self._prepare_paths(owner, bins)
            if not (self.datadir / "PG_VERSION").exists():
                self._initdb(owner, bins)
            self._write_settings(owner)
            if not self.password_path.exists():
                self._set_password(owner, bins)
            if not port_is_free(self._port):
                raise EmbeddedPostgresError(
                    f"port {self._port} is in use by another process; delete {self.metadata_path} to pick a new one"
                )
            self._run_pg_ctl(owner, bins, "start", "-l", str(self.log_path))
            write_json(self.metadata_path, {"port": self._port})

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``pg_ctl stop -m mode``); do nothing if it is not running. As root,
        the server's user is let search the paths again first: a chmod of a parent directory
        since the start (pytest does so to its base directory) resets the ACL that let it."""
        if mode not in STOP_MODES:
            raise ValueError(f"mode must be one of {STOP_MODES}, not {mode!r}")
        if not self.run_dir.exists():
            return
        with self._lock():
            if self._running_port() is None:
                return
            owner, bins = server_user(), bin_dir_for(self.datadir)
            if owner is not None:
                self._let_search(owner, bins)
            self._run_pg_ctl(owner, bins, "stop", "-m", mode)

    def is_running(self) -> bool:
        return self._running_port() is not None

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid, or None when the server is not running."""
        info = read_pid_file(self.datadir)
        return info[0] if info and is_postgres_process(info[0]) else None

    def _running_port(self) -> int | None:
        info = read_pid_file(self.datadir)
        return info[1] if info and is_postgres_process(info[0]) else None

    def _saved_port(self) -> int | None:
        try:
            return int(json.loads(self.metadata_path.read_text())["port"])
        except (OSError, ValueError, KeyError, TypeError):
            info = read_pid_file(self.datadir)  # a server started by someone who lost the file
            return info[1] if info else None

    @contextmanager
    def _lock(self) -> Iterator[None]:
        fd = os.open(self.run_dir / "postgres.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _prepare_paths(self, owner: pwd.struct_passwd | None, bins: Path) -> None:
        self.datadir.mkdir(mode=0o700, exist_ok=True)  # made here: the server's user cannot write run_dir
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        self.log_path.touch(mode=0o600, exist_ok=True)
        if owner is None:
            return
        for path in (self.socket_dir, self.log_path):
            os.chown(path, owner.pw_uid, owner.pw_gid)
        if self.datadir.stat().st_uid != owner.pw_uid:
            chown_tree(self.datadir, owner)  # e.g. a data directory copied by root
        self._let_search(owner, bins)

    def _let_search(self, owner: pwd.struct_passwd, bins: Path) -> None:
        """Let the server's user reach its run directory and its programs."""
        ensure_traversable(self.run_dir, owner)
        ensure_traversable(bins.parent, owner)

    def _initdb(self, owner: pwd.struct_passwd | None, bins: Path) -> None:
        args = [str(bins / "initdb"), "-D", str(self.datadir), *INITDB_OPTIONS]
        result = run_program(args, owner, cwd=self.run_dir, timeout=INITDB_TIMEOUT_S)
        if result.returncode != 0:
            raise EmbeddedPostgresError(f"initdb failed in {self.datadir}:\n{result.stdout.strip()}")
        with (self.datadir / "postgresql.conf").open("a") as conf:
            conf.write("\ninclude_if_exists = 'shardworker.conf'\n")

    def _write_settings(self, owner: pwd.struct_passwd | None) -> None:
        """Rewrite the settings this class owns; postgresql.conf includes them at its end."""
        sockets = str(self.socket_dir)
        if len(sockets) + len("/.s.PGSQL.65535.lock") > _SOCKET_PATH_MAX:
            sockets = ""  # too long for a unix socket path: TCP only, which is all the DSN uses
        path = self.datadir / "shardworker.conf"
        path.write_text(
            "# Written by shardworker.embedded on every start; edits here are lost.\n"
            f"port = {self._port}\n"
            "listen_addresses = '127.0.0.1'\n"
            f"unix_socket_directories = '{_conf_quote(sockets)}'\n"
            "unix_socket_permissions = 0700\n"
            "password_encryption = 'scram-sha-256'\n"
            "max_connections = 200\n"
        )
        hba = self.datadir / "pg_hba.conf"
        hba.write_text(
            "# Written by shardworker.embedded on every start; edits here are lost.\n"
            "# The socket's directory is 0700: only the server's own user reaches it.\n"
            "local all all trust\n"
            "host all all 127.0.0.1/32 scram-sha-256\n"
            "host all all ::1/128 scram-sha-256\n"
        )
        if owner is not None:
            for written in (path, hba):
                os.chown(written, owner.pw_uid, owner.pw_gid)

    def _set_password(self, owner: pwd.struct_passwd | None, bins: Path) -> None:
        """Give the postgres role a new random password (server stopped: single-user mode) and
        keep it in ``password`` (0600) only once the cluster has it."""
        password = secrets.token_urlsafe(24)
        args = [str(bins / "postgres"), "--single", "-D", str(self.datadir), "-c", "exit_on_error=true", "postgres"]
        result = run_program(args, owner, cwd=self.run_dir, timeout=INITDB_TIMEOUT_S,
                      stdin=f"ALTER ROLE postgres PASSWORD '{password}';\n")
        if result.returncode != 0:
            raise EmbeddedPostgresError(f"could not set the server's password in {self.datadir}:\n"
                                        f"{result.stdout.strip()}")
        atomic_write(str(self.run_dir), self.password_path.name, password.encode())  # 0600

    def _run_pg_ctl(self, owner: pwd.struct_passwd | None, bins: Path, action: str, *extra: str) -> None:
        wait = ["-w", "-t", str(PG_CTL_TIMEOUT_S)]
        args = [str(bins / "pg_ctl"), action, "-D", str(self.datadir), *wait, *extra]
        result = run_program(args, owner, cwd=self.run_dir, timeout=PG_CTL_TIMEOUT_S + 30)
        if result.returncode == 0 or (action == "stop" and not self.is_running()):
            return  # a failed stop of a server that is gone anyway (it crashed or was killed) is a stop
        raise EmbeddedPostgresError(
            f"pg_ctl {action} failed for {self.datadir}:\n{result.stdout.strip()}\n"
            f"--- last lines of {self.log_path} ---\n{tail(self.log_path)}"
        )


def ensure_embedded(base_dir: str | os.PathLike[str] = ".shardworker") -> str:
    """Start, or reuse if another process already did, the server in ``base_dir/pgdata``; return its DSN."""
    base = Path(base_dir).absolute()
    if not base.exists():
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        base.chmod(0o700)  # mkdir's mode is filtered by the umask
    owner = server_user()
    if owner is not None and base.stat().st_mode & stat.S_IXGRP == 0:
        # Let the server's user traverse without opening the directory to everyone: 0710 root:shardworker-pg.
        os.chown(base, -1, owner.pw_gid)
        base.chmod(base.stat().st_mode | stat.S_IXGRP)
    server = EmbeddedPostgres(base / "pgdata")
    if not server.is_running() and not port_is_free(server.port):
        server = EmbeddedPostgres(base / "pgdata", port=free_port())  # the saved port was taken meanwhile
    server.start()
    return server.dsn


def running_embedded(base_dir: str = ".shardworker") -> str:
    """The DSN of the server in ``base_dir/pgdata`` when it runs. Never creates or starts one:
    a command that only reads (``stats``, ``doctor``) says it is stopped instead."""
    datadir = Path(base_dir) / "pgdata"
    if not (datadir / "PG_VERSION").exists():
        raise EmbeddedNotRunning(f"no embedded PostgreSQL in {datadir}",
                                 "`shardworker embedded start` creates one (or give --dsn)")
    server = EmbeddedPostgres(datadir)
    if not server.is_running():
        raise EmbeddedNotRunning(f"the embedded PostgreSQL in {datadir} is stopped",
                                 "`shardworker embedded start` starts it (or give --dsn)")
    return server.dsn


def _conf_quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "''")


__all__ = [
    "EmbeddedNotRunning",
    "EmbeddedPostgres",
    "EmbeddedPostgresError",
    "PostgresBinariesNotFound",
    "bin_dir",
    "ensure_embedded",
    "running_embedded",
]
