"""A primary, an asynchronous streaming replica and a movable address: "the database comes back older".

``ReplicaSet`` builds, in a private temporary directory of its own::

    <root>/primary/pgdata      a copy of the migrated golden data directory (as ``private_pg`` makes)
    <root>/replica/pgdata      ``pg_basebackup -R`` of the primary: standby.signal + primary_conninfo
    <root>/backup-N/pgdata     each ``take_base_backup()`` (``pg_basebackup -X stream``, no ``-R``)

Each is an ``EmbeddedPostgres`` (so, as root, it runs as the unprivileged ``shardworker-pg`` and
asks TCP clients for the cluster's password, which all of them share: they are one cluster) on a
free port of its own, plus the settings of streaming replication (``ReplicationPostgres``). The
replica is asynchronous: no ``synchronous_standby_names``, so a commit on the primary waits for
nothing but its local flush, and the replica may lag behind it.

``forwarder`` (a ``Forwarder``: ``tests.proxy.PgProxy`` with its faults, plus ``retarget``) listens
on a free 127.0.0.1 port and is the address that moves at a failover: ``dsn`` goes through it, and is
what a worker should be given. ``execute("primary" | "replica" | "restored", sql)`` reaches a server
directly instead.

A failover that loses the last commits::

    with ReplicaSet(golden) as rs:             # or the ``replica_set`` fixture
        ...write through rs.dsn...
        rs.wait_replica_caught_up()
        rs.pause_replica()                     # stopped: it receives no more WAL
        ...write through rs.dsn: only the primary has this...
        rs.kill_primary()                      # pg_ctl stop -m immediate
        rs.promote_replica()                   # started detached from the primary, promoted
        rs.move_to_replica()                   # new connections go there; current ones are cut
        ...rs.dsn now serves the older database...

A restore from a base backup instead: ``backup = rs.take_base_backup()``, more writes,
``rs.kill_primary()``, ``rs.restore_backup(backup)`` (crash recovery from its backup_label up to the
end of the backup, then it runs as a primary; the forwarder moves to it).

Cleanup (``close()``, or leaving the ``with`` block, failed test or not) stops the forwarder and
every server (immediate) and removes the directory. Everything listens on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import psycopg
import pytest

from shardworker.embedded import EmbeddedPostgres, EmbeddedPostgresError
from shardworker.embedded.programs import bin_dir_for, run_program, server_user
from shardworker.embedded.state import free_port, tail
from tests.helpers import wait_for
from tests.proxy import PgProxy

__all__ = ["Forwarder", "ReplicaSet", "ReplicationPostgres", "replica_set"]

Which = Literal["primary", "replica", "restored"]

REPLICATION_SETTINGS = (
    "wal_level = replica\n"
    "max_wal_senders = 10\n"
    "hot_standby = on\n"
    "synchronous_standby_names = ''\n"  # asynchronous: a commit never waits for the replica
)
REPLICATION_HBA = "host replication all 127.0.0.1/32 scram-sha-256\n"  # the cluster's own auth, as for SQL
BASEBACKUP_TIMEOUT_S = 120.0
PROMOTE_TIMEOUT_S = 60
CONNECT_TIMEOUT_S = 3
POLL_S = 0.02


class ReplicationPostgres(EmbeddedPostgres):
    """An ``EmbeddedPostgres`` that also serves streaming replication to local TCP clients.

    ``EmbeddedPostgres`` rewrites ``shardworker.conf`` and ``pg_hba.conf`` on every start, so the
    replication settings are appended right after it writes them (an override of its
    ``_write_settings``): a ``pg_hba.conf`` edited beforehand would be lost on the next start.
    """

    def _write_settings(self, owner: pwd.struct_passwd | None) -> None:
        super()._write_settings(owner)
        with (self.datadir / "shardworker.conf").open("a") as conf:
            conf.write("# Added by tests.replica: streaming replication.\n" + REPLICATION_SETTINGS)
        with (self.datadir / "pg_hba.conf").open("a") as hba:
            hba.write("# Added by tests.replica: pg_basebackup and the replica's WAL receiver.\n" + REPLICATION_HBA)


class Forwarder(PgProxy):
    """The proxy of ``tests.proxy`` (every fault of it still works), whose upstream can move."""

    def retarget(self, upstream_port: int) -> int:
        """Send new connections to ``127.0.0.1:upstream_port`` and cut (RST) every current one,
        as a failover that moves an address does; returns how many were cut. Both happen on the
        proxy's loop at once: no connection accepted meanwhile reaches the old upstream."""
        return int(self._call(self._retarget(upstream_port)))

    async def _retarget(self, upstream_port: int) -> int:
        self.upstream_port = upstream_port
        return await self._reset_all(f"moved to port {upstream_port}")


class ReplicaSet:
    """A primary, its asynchronous streaming replica and a forwarder in front (module docstring)."""

    def __init__(self, golden_datadir: Path, *, dbname: str = "postgres", with_replica: bool = True) -> None:
        """``golden_datadir``: a stopped data directory with its ``password`` file beside it
        (what ``_private_pg_golden`` yields). ``dbname``: the database ``dsn`` names.
        ``with_replica=False``: no replica (a test of restoring backups only needs the primary)."""
        self.golden_datadir = Path(golden_datadir)
        self.dbname = dbname
        self.with_replica = with_replica
        self.root = Path(tempfile.mkdtemp(prefix="shardworker-replicaset-"))  # not tmp_path: see tests/conftest.py
        self.primary = ReplicationPostgres(self.root / "primary" / "pgdata", port=free_port())
        self.replica = ReplicationPostgres(self.root / "replica" / "pgdata", port=free_port())
        self.restored_servers: list[ReplicationPostgres] = []  # what restore_backup() started, in order
        self.forwarder = Forwarder(self.primary.port, dbname=dbname)
        self._backups = 0

    # lifecycle ---------------------------------------------------------------------------

    def start(self) -> ReplicaSet:
        """Start the primary, the forwarder (to the primary) and the replica; ``close()`` on failure."""
        try:
            self.primary.run_dir.mkdir(mode=0o700)
            shutil.copytree(self.golden_datadir, self.primary.datadir, symlinks=True)
            shutil.copy2(self.golden_datadir.parent / "password", self.primary.password_path)  # the cluster's own
            self.primary.start()
            self.forwarder.password = self._password()
            self.forwarder.start()
            if self.with_replica:
                self._base_backup(self.replica.datadir, "-R")  # -R: standby.signal and primary_conninfo
                shutil.copy2(self.primary.password_path, self.replica.password_path)
                self.replica.start()  # returns once it accepts (read-only) connections: it is consistent
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop the forwarder and every server (immediate), then remove the directory. Never raises
        for a server that is already gone; a server that cannot be stopped is killed."""
        with contextlib.suppress(Exception):
            self.forwarder.stop()
        for server in self._servers():
            try:
                server.stop("immediate")
            except Exception:
                pid = server.postmaster_pid()
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)  # its children exit on their postmaster's death
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ReplicaSet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # addresses ---------------------------------------------------------------------------

    @property
    def dsn(self) -> str:
        """The DSN through the forwarder, the address that moves: what a worker uses."""
        return self.forwarder.dsn

    def dsn_for(self, dbname: str) -> str:
        return self.forwarder.dsn_for(dbname)

    @property
    def serving(self) -> EmbeddedPostgres:
        """The server the forwarder sends new connections to."""
        for server in self._servers():
            if server.port == self.forwarder.upstream_port:
                return server
        raise AssertionError(f"the forwarder points at port {self.forwarder.upstream_port}, no server of this set")

    def server(self, which: Which | EmbeddedPostgres) -> EmbeddedPostgres:
        if isinstance(which, EmbeddedPostgres):
            return which
        if which == "primary":
            return self.primary
        if which == "replica" and self.with_replica:
            return self.replica
        if which == "restored" and self.restored_servers:
            return self.restored_servers[-1]
        raise ValueError(f"no {which!r} server in this set (which: 'primary', 'replica' unless with_replica=False, "
                         "'restored' after restore_backup())")

    def execute(self, which: Which | EmbeddedPostgres, sql: str, *params: Any,
                dbname: str | None = None) -> list[tuple[Any, ...]]:
        """Run one statement on that server directly (not through the forwarder), autocommit;
        its rows ([] for a statement that returns none)."""
        dsn = self.server(which).dsn_for(dbname or self.dbname)
        with psycopg.connect(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
            cur = conn.execute(sql, params or None)
            return cur.fetchall() if cur.description is not None else []

    # the failover ------------------------------------------------------------------------

    def wait_replica_caught_up(self, timeout_s: float = 10.0) -> str:
        """Block until the replica has replayed all the WAL the primary has written now (its
        ``pg_current_wal_lsn()``); returns that LSN. AssertionError on timeout."""
        if not self._replica().is_running():
            raise AssertionError("the replica is stopped (pause_replica()?): it cannot catch up")
        [(target,)] = self.execute("primary", "SELECT pg_current_wal_lsn()::text")

        def caught_up() -> bool:
            [(done,)] = self.execute("replica", "SELECT coalesce(pg_last_wal_replay_lsn() >= %s::pg_lsn, false)",
                                     target)
            return bool(done)

        wait_for(caught_up, timeout_s, f"the replica to replay the primary's WAL up to {target}", step_s=POLL_S)
        return str(target)

    def pause_replica(self) -> None:
        """Stop the replica (``pg_ctl stop -m fast``): from now on it receives no WAL, it lags."""
        self._replica().stop("fast")

    def resume_replica(self) -> None:
        """Start the paused replica again; it streams from the primary (if that still runs)."""
        self._replica().start()

    def kill_primary(self) -> None:
        """``pg_ctl stop -m immediate`` on the primary: a crash, no shutdown checkpoint."""
        self.primary.stop("immediate")

    def promote_replica(self, timeout_s: float = 30.0) -> None:
        """Start the replica detached from the primary (its ``primary_conninfo`` removed, so it
        cannot catch up even if the primary still ran), promote it (``pg_ctl promote -w``) and
        return once it accepts writes. The forwarder does not move: ``move_to_replica()``."""
        replica = self._replica()
        if replica.is_running():
            replica.stop("fast")  # to start it again without its primary_conninfo
        auto_conf = replica.datadir / "postgresql.auto.conf"
        kept = [line for line in auto_conf.read_text().splitlines(keepends=True)
                if not line.lstrip().startswith("primary_conninfo")]
        auto_conf.write_text("".join(kept))  # in place: its owner stays the server's user
        replica.start()  # a standby still: it replays what it has received, then waits
        self._pg_ctl(replica, "promote")
        wait_for(lambda: not self.execute("replica", "SELECT pg_is_in_recovery()")[0][0], timeout_s,
                 "the promoted replica to leave recovery", step_s=POLL_S)

    def move_to_replica(self) -> int:
        """Point the forwarder at the replica; returns how many current connections were cut."""
        return self.move_to("replica")

    def move_to(self, server: Which | EmbeddedPostgres) -> int:
        """Point the forwarder at ``server``; returns how many current connections were cut."""
        return self.forwarder.retarget(self.server(server).port)

    # restoring a base backup -----------------------------------------------------------------

    def take_base_backup(self, dest: Path | None = None) -> Path:
        """A base backup of the primary as it is now (``pg_basebackup -X stream``, fast checkpoint),
        into ``dest`` (default ``<root>/backup-N/pgdata``; its parent must be a directory of its own:
        the server's run directory). Returns the data directory, for ``restore_backup``."""
        if dest is None:
            self._backups += 1
            dest = self.root / f"backup-{self._backups}" / "pgdata"
        dest = Path(dest).absolute()
        self._base_backup(dest)
        return dest

    def restore_backup(self, datadir: Path, *, move: bool = True) -> ReplicationPostgres:
        """Start a server from the base backup in ``datadir`` on a free port (crash recovery from its
        backup_label, then a primary of its own), as ``restored``; with ``move``, point the
        forwarder at it (cutting current connections). Stop the primary first to play a restore."""
        datadir = Path(datadir).absolute()
        if not (datadir / "backup_label").exists():
            raise ValueError(f"{datadir} is not an unstarted base backup (no backup_label)")
        server = ReplicationPostgres(datadir, port=free_port())
        if not server.password_path.exists():
            shutil.copy2(self.primary.password_path, server.password_path)
        self.restored_servers.append(server)
        server.start()
        if move:
            self.move_to(server)
        return server

    # helpers -----------------------------------------------------------------------------

    def _servers(self) -> list[EmbeddedPostgres]:
        replica = [self.replica] if self.with_replica else []
        return [self.primary, *replica, *self.restored_servers]

    def _replica(self) -> EmbeddedPostgres:
        return self.server("replica")

    def _password(self) -> str:
        return self.primary.password_path.read_text().strip()

    def _base_backup(self, dest: Path, *extra: str) -> None:
        """``pg_basebackup`` of the primary into ``dest`` (which must not exist yet), with the
        primary's own binaries. It runs as this process's user; ``EmbeddedPostgres.start`` hands
        the data directory over to the server's user, as it does for ``private_pg``'s copy."""
        dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        bins = bin_dir_for(self.primary.datadir)
        args = [str(bins / "pg_basebackup"), "-d", self.primary.dsn, "-D", str(dest),
                "-X", "stream", "-c", "fast", "--no-sync", *extra]
        result = run_program(args, None, cwd=dest.parent, timeout=BASEBACKUP_TIMEOUT_S)
        if result.returncode != 0:
            raise EmbeddedPostgresError(f"pg_basebackup into {dest} failed:\n{result.stdout.strip()}\n"
                                        f"--- last lines of {self.primary.log_path} ---\n{tail(self.primary.log_path)}")

    def _pg_ctl(self, server: EmbeddedPostgres, action: str) -> None:
        """``pg_ctl <action> -w`` on ``server``, as its user (as ``EmbeddedPostgres`` runs pg_ctl)."""
        bins = bin_dir_for(server.datadir)
        args = [str(bins / "pg_ctl"), action, "-D", str(server.datadir), "-w", "-t", str(PROMOTE_TIMEOUT_S)]
        result = run_program(args, server_user(), cwd=server.run_dir, timeout=PROMOTE_TIMEOUT_S + 30)
        if result.returncode != 0:
            raise EmbeddedPostgresError(f"pg_ctl {action} failed for {server.datadir}:\n{result.stdout.strip()}\n"
                                        f"--- last lines of {server.log_path} ---\n{tail(server.log_path)}")


@pytest.fixture
def replica_set(_private_pg_golden: Path) -> Iterator[ReplicaSet]:
    """A started ``ReplicaSet`` (primary, caught-up-able replica, forwarder at the primary),
    cleaned up afterwards. Import it into a test module: ``replica_set = replica.replica_set``."""
    with ReplicaSet(_private_pg_golden) as replicas:
        yield replicas
