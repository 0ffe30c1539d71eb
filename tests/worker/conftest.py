"""Fixtures of tests/worker: ``store``, a real ``PgStore`` behind ``FlakyStore`` (the dispatcher tests)."""

from __future__ import annotations

from typing import Any

import pytest

from shardworker.store.pg_store import PgStore, StoreConfig
from tests.flaky_store import FlakyStore


@pytest.fixture
def store(pg_dsn: str) -> Any:
    s = PgStore(StoreConfig(dsn=pg_dsn, connect_timeout_s=3, statement_timeout_s=5))
    yield FlakyStore(s)
    s.close()
