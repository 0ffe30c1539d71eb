"""``shardworker doctor`` sees the database as production does: a transaction holding the xmin
horizon (named: pid, application, age), more dead than live rows in the jobs table, and
connections near ``max_connections``; each a warning with what to do, in text and --json."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import psycopg
import pytest

from shardworker.doctor import check_horizon
from shardworker.embedded import EmbeddedPostgres
from shardworker.store.production import SlotHolder
from tests.cli.doctor_report import invoke, report
from tests.helpers import enqueue, execute, wait_for


@contextlib.contextmanager
def held_horizon(dsn: str) -> Iterator[int]:
    """A REPEATABLE READ transaction that has read a row and stays open; yields its pid."""
    with psycopg.connect(dsn, application_name="nightly-report") as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.execute("SELECT count(*) FROM shardworker.jobs").fetchone()
        yield conn.info.backend_pid
        conn.rollback()


def test_a_transaction_holding_the_horizon_is_named(pg_dsn: str) -> None:
    with held_horizon(pg_dsn) as pid:
        time.sleep(1.2)
        code, checks = report("--dsn", pg_dsn)
        assert code == 0
        assert checks["horizon"]["status"] == "ok"  # 1 s is well under the default 5 minutes

        code, checks = report("--dsn", pg_dsn, "--horizon-age", "1")
        assert code == 0  # a warning: it deserves a look, nothing the worker needs
        horizon = checks["horizon"]
        assert horizon["status"] == "warn"
        assert f"pid {pid} (nightly-report" in horizon["detail"] and "pg_terminate_backend" in horizon["action"]
        [held] = horizon["transactions"]
        assert held["pid"] == pid and held["application"] == "nightly-report" and held["age_s"] >= 1

        text = invoke("--dsn", pg_dsn, "--horizon-age", "1").stdout
        [line] = [line for line in text.splitlines() if line.split()[1] == "horizon"]
        assert line.startswith("warn") and f"pid {pid}" in line and "->" in line
    _, checks = report("--dsn", pg_dsn, "--horizon-age", "1")
    assert checks["horizon"]["status"] == "ok"


def test_an_inactive_replication_slot_holding_an_xmin_is_named() -> None:
    slot = SlotHolder("old_cdc", "logical", False, 123456)
    check = check_horizon([], [slot, SlotHolder("live_replica", "physical", True, 10)])
    assert check.status.value == "warn"
    assert "replication slot old_cdc" in check.detail and "live_replica" not in check.detail
    assert "pg_drop_replication_slot" in (check.action or "")


def test_more_dead_rows_than_live_ones_in_the_jobs_table_warns(pg_dsn: str) -> None:
    execute(pg_dsn, "ALTER TABLE shardworker.jobs SET (autovacuum_enabled = false)")
    enqueue(pg_dsn, "count", 1500)
    _, checks = report("--dsn", pg_dsn)
    assert checks["dead-rows"]["status"] == "ok"
    for _ in range(2):
        execute(pg_dsn, "UPDATE shardworker.jobs SET priority = priority + 1")

    def warned() -> bool:
        _, checks = report("--dsn", pg_dsn)
        return checks["dead-rows"]["status"] == "warn"

    wait_for(warned, 20, "doctor to count the dead rows", step_s=0.5)
    _, checks = report("--dsn", pg_dsn)
    assert checks["dead-rows"]["dead"] > checks["dead-rows"]["live"] == 1500
    assert "VACUUM shardworker.jobs" in checks["dead-rows"]["action"]


@pytest.fixture
def small_server(private_pg: EmbeddedPostgres) -> EmbeddedPostgres:
    """The private server restarted with max_connections = 12."""
    execute(private_pg.dsn, "ALTER SYSTEM SET max_connections = 12")
    private_pg.stop("fast")
    private_pg.start()
    return private_pg


def test_connections_near_max_connections_warn(small_server: EmbeddedPostgres) -> None:
    dsn = small_server.dsn
    _, checks = report("--dsn", dsn)
    assert checks["connections"]["status"] == "ok" and checks["connections"]["max_connections"] == 12
    with contextlib.ExitStack() as stack:
        for _ in range(9):
            stack.enter_context(psycopg.connect(dsn))
        code, checks = report("--dsn", dsn)
    assert code == 0
    assert checks["connections"]["status"] == "warn"
    assert checks["connections"]["open"] == 10  # nine and doctor's own
    assert "of max_connections 12" in checks["connections"]["detail"]
    assert "PgBouncer" in checks["connections"]["action"]
