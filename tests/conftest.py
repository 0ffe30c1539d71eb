"""Real PostgreSQL for tests: one server per session, a fresh database per test.

Server, first that works: ``$SHARDWORKER_TEST_DSN``; a Docker container (testcontainers) when a
Docker engine answers; an embedded server (``shardworker.embedded``) in a temporary directory.
The schema is migrated once into a template database; each test clones it (``CREATE DATABASE
... TEMPLATE``, ~10 ms for a small schema) instead of migrating again.
Fault tests that stop the server use ``private_pg``, a server of their own.

Embedded servers live in ``tempfile.mkdtemp()`` directories, not under pytest's ``tmp_path``: every
pytest session that starts resets ``/tmp/pytest-of-<user>`` to 0700, which (when tests run as root)
locks out the unprivileged user the server runs as, in the middle of another session's initdb.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from shardworker.embedded import EmbeddedPostgres, PostgresBinariesNotFound, bin_dir

TEMPLATE_DB = "shardworker_template"
DOCKER_IMAGE = "postgres:16-alpine"
DOCKER_PING_TIMEOUT_S = 1.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class PgServer:
    """A PostgreSQL server tests may create and drop databases on."""

    admin_dsn: str
    kind: str  # "env", "docker" or "embedded"
    embedded: EmbeddedPostgres | None = None

    def dsn_for(self, dbname: str) -> str:
        if self.embedded is not None:
            return self.embedded.dsn_for(dbname)
        return make_conninfo(self.admin_dsn, dbname=dbname)


@dataclass(frozen=True)
class PgTemplate:
    name: str
    applied: list[str] | None  # what the migration hook returned; None when there is no hook yet


def _docker_answers() -> bool:
    """True when a Docker engine replies to GET /_ping within a second."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        if host.startswith("unix://"):
            if not os.path.exists(host[len("unix://") :]):
                return False
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            address: str | tuple[str, int] = host[len("unix://") :]
        elif host.startswith("tcp://"):
            name, _, port = host[len("tcp://") :].rstrip("/").partition(":")
            sock, address = socket.socket(socket.AF_INET, socket.SOCK_STREAM), (name, int(port or 2375))
        else:
            return False
        with sock:
            sock.settimeout(DOCKER_PING_TIMEOUT_S)
            sock.connect(address)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            return b" 200 " in sock.recv(64)
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _docker_server() -> Iterator[PgServer | None]:
    if not _docker_answers():
        yield None
        return
    try:
        try:
            from testcontainers.community.postgres import PostgresContainer
        except ImportError:
            from testcontainers.postgres import PostgresContainer
        container = PostgresContainer(DOCKER_IMAGE, driver=None).start()
    except Exception:  # any failure to start a container means: use the embedded server instead
        yield None
        return
    try:
        yield PgServer(container.get_connection_url(), "docker")
    finally:
        container.stop()


@contextlib.contextmanager
def _server_dir(prefix: str) -> Iterator[Path]:
    """A fresh private directory for an embedded server, removed afterwards (see the module docstring)."""
    path = Path(tempfile.mkdtemp(prefix=f"shardworker-{prefix}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def server_dir() -> Iterator[Path]:
    """An empty directory for a test's own embedded server (``<server_dir>/pgdata``), removed afterwards."""
    with _server_dir("test") as path:
        yield path


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """The session's PostgreSQL server."""
    if os.environ.get("SHARDWORKER_TEST_DSN"):
        yield PgServer(os.environ["SHARDWORKER_TEST_DSN"], "env")
        return
    with _docker_server() as docker:
        if docker is not None:
            yield docker
            return
    with _server_dir("session") as path:
        server = _embedded_or_skip(path / "pgdata")
        server.start()
        try:
            yield PgServer(server.dsn, "embedded", server)
        finally:
            server.stop("fast")


def _embedded_or_skip(datadir: Path) -> EmbeddedPostgres:
    try:
        bin_dir()
    except PostgresBinariesNotFound as exc:
        pytest.skip(f"no PostgreSQL server for tests: {exc}")
    return EmbeddedPostgres(datadir)


def _migration_hook() -> Callable[[str], list[str]] | None:
    """``shardworker.store.migrate.apply_migrations`` once it exists, else None."""
    try:
        module = importlib.import_module("shardworker.store.migrate")
    except ModuleNotFoundError as exc:
        if exc.name in ("shardworker", "shardworker.store.migrate"):
            return None
        raise  # the module exists but is broken: say so
    return getattr(module, "apply_migrations", None)


def _migrate(dsn: str) -> list[str] | None:
    hook = _migration_hook()
    return None if hook is None else list(hook(dsn))


def _admin(server: PgServer, statement: sql.Composed) -> None:
    with psycopg.connect(server.admin_dsn, autocommit=True) as conn:
        conn.execute(statement)


@pytest.fixture(scope="session")
def pg_template(pg_server: PgServer) -> Iterator[PgTemplate]:
    """A database holding the migrated schema, cloned by ``pg_dsn``; nobody may connect to it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # xdist workers share an external server
    name = f"{TEMPLATE_DB}_{worker}" if worker else TEMPLATE_DB
    ident = sql.Identifier(name)
    _admin(pg_server, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
    _admin(pg_server, sql.SQL("CREATE DATABASE {}").format(ident))
    applied = _migrate(pg_server.dsn_for(name))
    # A connection the hook left open would make every CREATE DATABASE ... TEMPLATE fail.
    _admin(pg_server, sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(ident))
    _admin(
        pg_server,
        sql.SQL("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = {}").format(sql.Literal(name)),
    )
    yield PgTemplate(name, applied)
    _admin(pg_server, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))


@pytest.fixture
def pg_dsn(pg_server: PgServer, pg_template: PgTemplate) -> Iterator[str]:
    """DSN of a fresh, migrated database for this test alone, dropped afterwards."""
    name = f"test_{uuid.uuid4().hex}"
    _admin(
        pg_server,
        sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(pg_template.name)),
    )
    try:
        yield pg_server.dsn_for(name)
    finally:
        _admin(pg_server, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def empty_dsn(pg_server: PgServer) -> Iterator[str]:
    """DSN of a brand-new database without the shardworker schema, dropped afterwards."""
    name = f"empty_{uuid.uuid4().hex}"
    _admin(pg_server, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield pg_server.dsn_for(name)
    finally:
        _admin(pg_server, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def _private_pg_golden() -> Iterator[Path]:
    """A migrated, cleanly stopped data directory that ``private_pg`` copies (~0.1 s) instead of initdb."""
    with _server_dir("golden") as path:
        server = _embedded_or_skip(path / "pgdata")
        server.start()
        try:
            _migrate(server.dsn)
        finally:
            server.stop("fast")
        yield server.datadir


@pytest.fixture
def private_pg(_private_pg_golden: Path) -> Iterator[EmbeddedPostgres]:
    """A started, migrated server of the test's own, free to be stopped (even ``immediate``) and restarted."""
    with _server_dir("private") as path:
        shutil.copytree(_private_pg_golden, path / "pgdata", symlinks=True)
        shutil.copy2(_private_pg_golden.parent / "password", path / "password")  # the cluster's own
        server = EmbeddedPostgres(path / "pgdata")
        server.start()
        try:
            yield server
        finally:
            server.stop("immediate")  # its data is thrown away next


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    """A worker's outbox directory (not made: the worker makes it 0700) and the directory its
    handlers count their runs in (``tests/apps/run_ledger.py``), where its log goes too."""
    (tmp_path / "counts").mkdir()
    return tmp_path / "outbox", tmp_path / "counts"


@pytest.fixture(autouse=True)
def _no_leftover_workers() -> Iterator[None]:
    """Kill every worker a test started (its whole process group), even when the test failed."""
    from tests.helpers import STARTED, kill_worker_group

    yield
    while STARTED:
        kill_worker_group(STARTED.pop())
