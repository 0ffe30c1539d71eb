"""The harness of ``tests/replica.py`` does what it claims: after a failover to a lagging async
replica, or a restore from a base backup, the address a worker uses serves an older database,
which lost the commits made after the replica paused (or after the backup), and accepts writes."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests import replica as replica_module
from tests.helpers import execute, query
from tests.replica import ReplicaSet

replica_set = replica_module.replica_set  # the fixture


def ids(dsn: str) -> list[int]:
    return [row[0] for row in query(dsn, "SELECT id FROM probe ORDER BY id")]


def test_a_promoted_lagging_replica_has_lost_the_commits_after_its_pause(replica_set: ReplicaSet) -> None:
    rs = replica_set
    execute(rs.dsn, "CREATE TABLE probe (id int PRIMARY KEY)")
    execute(rs.dsn, "INSERT INTO probe SELECT generate_series(1, 10)")
    rs.wait_replica_caught_up()
    assert rs.execute("replica", "SELECT count(*) FROM probe") == [(10,)]

    rs.pause_replica()
    execute(rs.dsn, "INSERT INTO probe SELECT generate_series(11, 20)")
    assert ids(rs.dsn) == list(range(1, 21))  # committed, on the primary only
    rs.kill_primary()
    with pytest.raises(psycopg.OperationalError):
        query(rs.dsn, "SELECT 1")  # the address leads to a dead server until it moves
    rs.promote_replica()
    rs.move_to_replica()

    assert rs.serving is rs.replica
    assert ids(rs.dsn) == list(range(1, 11))  # the database came back older: 11..20 are gone
    assert query(rs.dsn, "SELECT pg_is_in_recovery()") == [(False,)]
    execute(rs.dsn, "INSERT INTO probe SELECT generate_series(11, 12)")  # writable; the lost ids are free again
    assert ids(rs.dsn) == list(range(1, 13))


def test_a_restored_base_backup_has_lost_the_commits_after_it(_private_pg_golden: Path) -> None:
    with ReplicaSet(_private_pg_golden, with_replica=False) as rs:
        execute(rs.dsn, "CREATE TABLE probe (id int PRIMARY KEY)")
        execute(rs.dsn, "INSERT INTO probe SELECT generate_series(1, 10)")
        backup = rs.take_base_backup()
        execute(rs.dsn, "INSERT INTO probe SELECT generate_series(11, 20)")
        assert ids(rs.dsn) == list(range(1, 21))

        rs.kill_primary()
        restored = rs.restore_backup(backup)

        assert rs.serving is restored
        assert ids(rs.dsn) == list(range(1, 11))
        assert query(rs.dsn, "SELECT pg_is_in_recovery()") == [(False,)]
        execute(rs.dsn, "INSERT INTO probe VALUES (11)")
        assert rs.execute("restored", "SELECT max(id) FROM probe") == [(11,)]


def test_moving_the_forwarder_cuts_its_connections_and_sends_new_ones_to_the_new_server(
        replica_set: ReplicaSet) -> None:
    rs = replica_set
    with psycopg.connect(rs.dsn, autocommit=True) as held:
        assert held.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)  # the primary
        assert rs.move_to_replica() == 1
        with pytest.raises(psycopg.OperationalError):
            held.execute("SELECT 1")
    assert query(rs.dsn, "SELECT pg_is_in_recovery()") == [(True,)]  # the replica, still a standby
    rs.move_to("primary")
    assert query(rs.dsn, "SELECT pg_is_in_recovery()") == [(False,)]
