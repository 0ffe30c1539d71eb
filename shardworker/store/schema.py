"""The schema's migration files: which exist, in order, and the version this code needs.

``migrations/*.sql`` at the repository root is the source; ``shardworker/migrations``
links to it so that wheels carry the files as package data. Each file is named
``NNNN_what_it_does.sql`` and is applied once, in its own transaction, by
``shardworker migrate`` (``shardworker.store.migrate``). No database here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from shardworker.errors import SchemaMissing

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    def sql(self) -> str:
        return self.path.read_text(encoding="utf-8")


def available_migrations() -> list[Migration]:
    """Every migration file, in version order."""
    found = [Migration(int(m.group(1)), path) for path in sorted(MIGRATIONS_DIR.glob("*.sql"))
             if (m := _NAME.match(path.name))]
    if not found:
        raise SchemaMissing(f"no migrations found in {MIGRATIONS_DIR}")
    return found


def latest_version() -> int:
    """The schema version this code needs."""
    return available_migrations()[-1].version
