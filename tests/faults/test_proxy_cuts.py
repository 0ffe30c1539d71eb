"""The fault proxy itself (tests/proxy.py): an "after" cut lets the server run the rest of the
pipeline up to its Sync, so "committed=True" in its event means the transaction committed,
however the client's writes fell into the chunks the proxy read."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from shardworker.store.embedded import EmbeddedPostgres
from tests import proxy as proxy_module
from tests.helpers import execute, query
from tests.proxy import PgProxy

pg_proxy = proxy_module.pg_proxy  # the fixture: a proxy in front of ``private_pg``


def _send(conn: psycopg.Connection[Any], sql: str) -> None:
    conn.pgconn.send_query_params(sql.encode(), None)


def test_after_cut_runs_the_rest_of_a_pipeline_read_in_parts(private_pg: EmbeddedPostgres, pg_proxy: PgProxy) -> None:
    """BEGIN, the matched INSERT and COMMIT reach the proxy in one write, the Sync in a later
    one: the COMMIT must still reach the server, as the event's committed=True says."""
    dsn = private_pg.dsn_for("postgres")
    execute(dsn, "CREATE TABLE cut_probe (marker text)")
    pg_proxy.cut_on_query(b"INSERT INTO cut_probe", when="after")
    conn = psycopg.connect(pg_proxy.dsn, autocommit=True)
    try:
        pgconn = conn.pgconn
        pgconn.enter_pipeline_mode()
        _send(conn, "BEGIN")
        _send(conn, "INSERT INTO cut_probe VALUES ('kept')")
        _send(conn, "COMMIT")
        while pgconn.flush():  # one write for the three
            pass
        time.sleep(0.3)  # the proxy reads them as one chunk, without a Sync
        pgconn.pipeline_sync()
        while pgconn.flush():
            pass
        [cut] = pg_proxy.wait_events("cut", 1, 10)
    finally:
        conn.close()
    assert "committed=True" in cut.detail, cut
    assert query(dsn, "SELECT marker FROM cut_probe") == [("kept",)], cut


@pytest.mark.parametrize("sync_with_it", [True, False])
def test_after_cut_drops_what_follows_the_sync(private_pg: EmbeddedPostgres, pg_proxy: PgProxy,
                                               sync_with_it: bool) -> None:
    """What the client sends after the cut pipeline's Sync never reaches the server."""
    dsn = private_pg.dsn_for("postgres")
    execute(dsn, "CREATE TABLE cut_probe (marker text)")
    pg_proxy.cut_on_query(b"INSERT INTO cut_probe VALUES ('first')", when="after")
    conn = psycopg.connect(pg_proxy.dsn, autocommit=True)
    try:
        pgconn = conn.pgconn
        pgconn.enter_pipeline_mode()
        _send(conn, "INSERT INTO cut_probe VALUES ('first')")
        pgconn.pipeline_sync()
        if not sync_with_it:
            while pgconn.flush():
                pass
            time.sleep(0.3)
        _send(conn, "INSERT INTO cut_probe VALUES ('second')")
        pgconn.pipeline_sync()
        while pgconn.flush():
            pass
        pg_proxy.wait_events("cut", 1, 10)
    finally:
        conn.close()
    assert query(dsn, "SELECT marker FROM cut_probe") == [("first",)]


def test_commit_cut_waits_for_the_transaction_to_end(private_pg: EmbeddedPostgres, pg_proxy: PgProxy) -> None:
    """A statement matched in one round trip, its transaction committed in the next: the client
    gets the first reply, then loses the COMMIT's and its connection; the row is committed."""
    dsn = private_pg.dsn_for("postgres")
    execute(dsn, "CREATE TABLE cut_probe (marker text)")
    pg_proxy.cut_on_query(b"INSERT INTO cut_probe", when="commit")
    conn = psycopg.connect(pg_proxy.dsn)
    try:
        assert conn.execute("INSERT INTO cut_probe VALUES ('kept') RETURNING marker").fetchall() == [("kept",)]
        with pytest.raises(psycopg.OperationalError):
            conn.commit()
    finally:
        conn.close()
    [cut] = pg_proxy.wait_events("cut", 1, 10)
    assert "committed=True" in cut.detail, cut
    assert query(dsn, "SELECT marker FROM cut_probe") == [("kept",)]
