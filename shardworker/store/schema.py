"""The schema's migration files: which exist, in order, and the version this code needs.

``migrations/*.sql`` at the repository root is the only copy; the build ships that directory
as the package ``shardworker.migrations``, read here through ``importlib.resources`` (the same
in a checkout, an editable install and a wheel). Each file is named ``NNNN_what_it_does.sql``
and is applied once, in its own transaction, by ``shardworker migrate``
(``shardworker.store.migrate``). No database here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable

from shardworker.errors import SchemaMissing
from shardworker.store.sql import current_schema, in_schema

MIGRATIONS_PACKAGE = "shardworker.migrations"
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    path: Traversable

    @property
    def name(self) -> str:
        return self.path.name

    def sql(self) -> str:
        """The migration's SQL, in the schema in use (``shardworker.store.sql.in_schema``)."""
        return in_schema(self.path.read_text(encoding="utf-8"), current_schema())


def available_migrations() -> list[Migration]:
    """Every migration file, in version order."""
    directory = files(MIGRATIONS_PACKAGE)
    found = [Migration(int(m.group(1)), path) for path in sorted(directory.iterdir(), key=lambda p: p.name)
             if (m := _NAME.match(path.name))]
    if not found:
        raise SchemaMissing(f"no migrations found in {directory}")
    return found


def latest_version() -> int:
    """The schema version this code needs."""
    return available_migrations()[-1].version
