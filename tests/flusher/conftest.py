"""The flusher tests' store: a real PostgreSQL behind a ``FlakyStore`` that fails chosen calls."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shardworker.store.pg_store import PgStore, StoreConfig
from tests.flaky_store import FlakyStore


@pytest.fixture
def store(pg_dsn: str) -> Iterator[FlakyStore]:
    s = PgStore(StoreConfig(dsn=pg_dsn, connect_timeout_s=3, statement_timeout_s=5))
    yield FlakyStore(s)
    s.close()
