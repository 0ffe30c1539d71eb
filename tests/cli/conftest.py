"""Fixtures the command-line tests share: a store on the test's database, and running a
test in an empty directory of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shardworker.store.pg_store import PgStore, StoreConfig


@pytest.fixture
def store(pg_dsn: str) -> Iterator[PgStore]:
    s = PgStore(StoreConfig(dsn=pg_dsn))
    yield s
    s.close()


@pytest.fixture
def in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run in an empty directory: the default outbox path (.shardworker/outbox) is relative."""
    monkeypatch.chdir(tmp_path)
