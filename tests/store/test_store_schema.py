"""PgStore on a real PostgreSQL: migrating, and ``check_schema`` refusing a database whose
schema is missing, dropped or behind."""

from __future__ import annotations

import pytest

from shardworker.errors import SchemaMissing
from shardworker.store.pg_store import PgStore, StoreConfig
from shardworker.store.schema import available_migrations, latest_version
from tests.store.support import add_id, connect, row


def test_migrate_applies_every_file_once_then_nothing(empty_dsn: str) -> None:
    """The first migrate applies every migration in order; the second applies none and changes nothing."""
    store = PgStore(StoreConfig(dsn=empty_dsn))
    try:
        expected = [m.name for m in available_migrations()]
        assert expected[:2] == ["0001_create_jobs.sql", "0002_create_workers.sql"]
        assert store.migrate(available_migrations()) == expected
        assert store.migrate(available_migrations()) == []
        store.check_schema()
    finally:
        store.close()
    with connect(empty_dsn) as conn:
        ledger = conn.execute("SELECT version, name FROM shardworker.migrations ORDER BY version").fetchall()
    assert [name for _, name in ledger] == expected


def test_migrate_on_migrated_database_applies_nothing(store: PgStore, pg_dsn: str) -> None:
    """Migrating an up-to-date database is a no-op that keeps existing jobs."""
    job_id = add_id(store)
    assert store.migrate(available_migrations()) == []
    assert row(pg_dsn, job_id)["status"] == "queued"


def test_check_schema_raises_schema_missing_on_empty_database(empty_dsn: str) -> None:
    """check_schema (and any query) raises SchemaMissing when the schema was never created."""
    store = PgStore(StoreConfig(dsn=empty_dsn))
    try:
        with pytest.raises(SchemaMissing):
            store.check_schema()
        with pytest.raises(SchemaMissing):
            store.claim(["k"], None, "w1", 10)
    finally:
        store.close()


def test_check_schema_raises_when_schema_was_dropped(store: PgStore, pg_dsn: str) -> None:
    """Dropping the shardworker schema makes check_schema raise SchemaMissing."""
    store.check_schema()
    with connect(pg_dsn) as conn:
        conn.execute("DROP SCHEMA shardworker CASCADE")
    with pytest.raises(SchemaMissing):
        store.check_schema()


def test_check_schema_raises_when_ledger_is_behind(store: PgStore, pg_dsn: str) -> None:
    """A ledger missing the newest migration raises SchemaMissing naming both versions."""
    latest = latest_version()
    before = max(m.version for m in available_migrations() if m.version < latest)  # numbers may skip one
    with connect(pg_dsn) as conn:
        conn.execute("DELETE FROM shardworker.migrations WHERE version = %s", (latest,))
    with pytest.raises(SchemaMissing) as info:
        store.check_schema()
    assert f"version {before}" in str(info.value)
    assert f"needs {latest}" in str(info.value)


def test_a_library_call_on_a_schema_without_a_newer_function_says_to_migrate(pg_dsn: str) -> None:
    """An app that upgrades the library before anyone runs `shardworker migrate` (its calls do
    not check the schema, as a worker's start does): a statement calling a function of a newer
    migration raises SchemaMissing, "run shardworker migrate", not a bare database error."""
    from shardworker import jobs
    from shardworker.client import enqueue

    job_id = enqueue(pg_dsn, "k")
    with connect(pg_dsn) as conn:
        conn.execute("DROP FUNCTION shardworker.notify_finished(bigint[])")
    with pytest.raises(SchemaMissing, match="shardworker migrate"):
        jobs.cancel(pg_dsn, [job_id])
