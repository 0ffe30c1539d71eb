"""The schema as the database holds it: applying migrations under a lock, checking that
this code's version is there, and the read-only probes ``shardworker doctor`` makes
(applied versions, the server's clock, whether it accepts writes)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from shardworker.errors import SchemaMissing
from shardworker.store.connection import Session, migrate_command, schema_missing
from shardworker.store.schema import Migration, latest_version
from shardworker.store.sql import current_schema, query


@dataclass(frozen=True)
class ServerState:
    """What ``server_state`` saw: the server's clock and local clocks around the query
    (epoch seconds), and whether it is a standby or read-only."""

    server_time: float
    sent_at: float
    received_at: float
    in_recovery: bool
    read_only: bool


class SchemaQueries(Session):
    """Migrations and schema probes, on one session."""

    def migrate(self, migrations: Sequence[Migration]) -> list[str]:
        """Apply those of ``migrations`` not yet applied, in order, each in its own
        transaction that first takes the migration lock and then reads what is applied
        (another run may have applied it meanwhile); returns the names applied."""
        applied: list[str] = []
        with self.cursor() as cur:
            for migration in migrations:
                with cur.connection.transaction():
                    cur.execute(query("migration_lock"))
                    done = applied_versions(cur)
                    if done is None or migration.version not in done:
                        cur.execute(migration.sql().encode())
                        cur.execute(query("migration_record"), {"version": migration.version,
                                                                "name": migration.name})
                        applied.append(migration.name)
        return applied

    def check_schema(self) -> None:
        """Raise ``SchemaMissing`` unless every migration this code knows is applied."""
        latest = latest_version()
        done = self.schema_versions()
        if done is None:
            raise SchemaMissing(schema_missing())
        current = max(done, default=None)
        if current is None or current < latest:
            raise SchemaMissing(f"the {current_schema()} schema is at version {current}, the code needs {latest}: "
                                f"run `{migrate_command()}`")

    def schema_versions(self) -> set[int] | None:
        """Migration versions recorded as applied; None when the ledger table does not exist."""
        with self.cursor() as cur:
            return applied_versions(cur)

    def server_state(self) -> ServerState:
        """The server's clock (bracketed by local times around the round trip) and whether
        it accepts writes; reads settings only, so it leaves nothing behind."""
        with self.cursor() as cur:
            sent = time.time()
            cur.execute(query("doctor_server_state"))
            received = time.time()
            row = cur.fetchone()
        assert row is not None
        return ServerState(row[0].timestamp(), sent, received, bool(row[1]), bool(row[2]))


def applied_versions(cur: psycopg.Cursor[Any]) -> set[int] | None:
    """Versions applied so far; None when the migrations table does not exist."""
    cur.execute(query("migration_table_exists"))
    row = cur.fetchone()
    if not row or not row[0]:
        return None
    cur.execute(query("migration_versions"))
    return {r[0] for r in cur.fetchall()}
