"""Fixtures of the store tests: ``store`` and ``other``, two stores on a fresh database."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shardworker.store.pg_store import PgStore, StoreConfig


@pytest.fixture
def store(pg_dsn: str) -> Iterator[PgStore]:
    s = PgStore(StoreConfig(dsn=pg_dsn, connect_timeout_s=3, statement_timeout_s=5))
    yield s
    s.close()


@pytest.fixture
def other(pg_dsn: str) -> Iterator[PgStore]:
    """A second store on the same database: another worker's connection."""
    s = PgStore(StoreConfig(dsn=pg_dsn, connect_timeout_s=3, statement_timeout_s=5))
    yield s
    s.close()
