"""Apply the schema migrations: ``apply_migrations(dsn)`` is ``shardworker migrate``."""

from __future__ import annotations

from shardworker.pg_store import PgStore, StoreConfig
from shardworker.schema import available_migrations


def apply_migrations(dsn: str) -> list[str]:
    """Apply pending ``migrations/*.sql`` in order; returns the file names applied."""
    store = PgStore(StoreConfig(dsn))
    try:
        return store.migrate(available_migrations())
    finally:
        store.close()
