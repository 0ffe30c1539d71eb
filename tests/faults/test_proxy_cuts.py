"""The fault proxy itself (tests/proxy.py): an "after" cut lets the server run the rest of the
pipeline up to its Sync, so "committed=True" in its event means the transaction committed,
however the client's writes fell into the chunks the proxy read."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from shardworker.embedded import EmbeddedPostgres
from tests import proxy as proxy_module
from tests.helpers import execute, query
from tests.proxy import PgProxy

pg_proxy = proxy_module.pg_proxy  # the fixture: a proxy in front of ``private_pg``


@pytest.fixture
def dsn(private_pg: EmbeddedPostgres) -> str:
    """The server itself (not through the proxy), with an empty table ``cut_probe``."""
    direct = private_pg.dsn_for("postgres")
    execute(direct, "CREATE TABLE cut_probe (marker text)")
    return direct


@contextlib.contextmanager
def pipeline_through(proxy: PgProxy) -> Iterator[Any]:
    """libpq's own pipeline mode on a connection through ``proxy``: what is sent when is the test's."""
    conn = psycopg.connect(proxy.dsn, autocommit=True)
    try:
        conn.pgconn.enter_pipeline_mode()
        yield conn.pgconn
    finally:
        conn.close()


def _send(pgconn: Any, *statements: str, sync: bool = False) -> None:
    """Queue ``statements`` (and a Sync), then write them all: one write, read by the proxy as one chunk."""
    for sql in statements:
        pgconn.send_query_params(sql.encode(), None)
    if sync:
        pgconn.pipeline_sync()
    while pgconn.flush():
        pass


def test_after_cut_runs_the_rest_of_a_pipeline_read_in_parts(dsn: str, pg_proxy: PgProxy) -> None:
    """BEGIN, the matched INSERT and COMMIT reach the proxy in one write, the Sync in a later
    one: the COMMIT must still reach the server, as the event's committed=True says."""
    pg_proxy.cut_on_query(b"INSERT INTO cut_probe", when="after")
    with pipeline_through(pg_proxy) as pgconn:
        _send(pgconn, "BEGIN", "INSERT INTO cut_probe VALUES ('kept')", "COMMIT")
        time.sleep(0.3)  # read as one chunk, without a Sync
        _send(pgconn, sync=True)
        [cut] = pg_proxy.wait_events("cut", 1, 10)
    assert "committed=True" in cut.detail, cut
    assert query(dsn, "SELECT marker FROM cut_probe") == [("kept",)], cut


@pytest.mark.parametrize("sync_with_it", [True, False])
def test_after_cut_drops_what_follows_the_sync(dsn: str, pg_proxy: PgProxy, sync_with_it: bool) -> None:
    """What the client sends after the cut pipeline's Sync never reaches the server, in the same
    chunk or a later one."""
    pg_proxy.cut_on_query(b"INSERT INTO cut_probe VALUES ('first')", when="after")
    with pipeline_through(pg_proxy) as pgconn:
        pgconn.send_query_params(b"INSERT INTO cut_probe VALUES ('first')", None)
        pgconn.pipeline_sync()
        if not sync_with_it:
            _send(pgconn)
            time.sleep(0.3)
        _send(pgconn, "INSERT INTO cut_probe VALUES ('second')", sync=True)
        pg_proxy.wait_events("cut", 1, 10)
    assert query(dsn, "SELECT marker FROM cut_probe") == [("first",)]


def test_commit_cut_waits_for_the_transaction_to_end(dsn: str, pg_proxy: PgProxy) -> None:
    """A statement matched in one round trip, its transaction committed in the next: the client
    gets the first reply, then loses the COMMIT's and its connection; the row is committed."""
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
