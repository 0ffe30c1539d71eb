"""The database an outbox directory belongs to.

Outcomes in an outbox are for the jobs of one database. At first use the worker records
that database's identity in the directory (``database.json``: the instance id that
migration 0004 gave the schema, the database's name, and the server it was reached at);
from then on a worker, its flusher or ``outbox drain`` pointed at another database refuses
with one line naming both, instead of applying outcomes whose jobs are not there. A copy of
the same database (a failover replica, a restore) keeps the instance id and is accepted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

import orjson

from outbox import atomic_write, read_small
from shardworker.core.config import DEFAULT_SCHEMA
from shardworker.core.layout import DATABASE_FILE
from shardworker.errors import ShardworkerError


class WrongDatabase(ShardworkerError):
    """This outbox belongs to another database."""


class IdentityStore(Protocol):
    def identity(self) -> tuple[str, str, str]: ...


@dataclass(frozen=True)
class Binding:
    instance: str
    database: str
    server: str
    embedded: bool = False
    schema: str | None = None  # the jobs' schema (--schema); None: recorded before schemas were

    def describe(self) -> str:
        schema = "" if self.schema in (None, DEFAULT_SCHEMA) else f", schema {self.schema}"
        return f"database {self.database!r} on {self.server} (instance {self.instance[:8]}{schema})"

    def same_database(self, other: Binding) -> bool:
        return (self.instance, self.database) == (other.instance, other.database)

    def mend(self, other: Binding) -> str:
        """What to do when the outbox of this binding is pointed at ``other``."""
        if self.schema is not None and other.schema is not None and self.schema != other.schema \
                and (self.database, self.server) == (other.database, other.server):
            return f"give --schema {self.schema}: this outbox holds the outcomes of that schema's jobs"
        if (self.database, self.server) == (other.database, other.server):
            return ("another schema of the same database (give the --schema its jobs are in), or a database "
                    "made anew")
        return "point --dsn at the database it belongs to"


def schema_in_use() -> str:
    """The jobs' schema of this process, as the worker's commands set it (``--schema``)."""
    return os.environ.get("SHARDWORKER_SCHEMA") or DEFAULT_SCHEMA


def bound_to(directory: str) -> Binding | None:
    """The binding recorded in ``directory``, or None before its first use."""
    try:
        doc = orjson.loads(read_small(os.path.join(directory, DATABASE_FILE)))
        schema = doc.get("schema")
        return Binding(str(doc["instance"]), str(doc["database"]), str(doc["server"]), bool(doc["embedded"]),
                       None if schema is None else str(schema))
    except FileNotFoundError:
        return None
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise ShardworkerError(f"{os.path.join(directory, DATABASE_FILE)} is damaged ({exc}); it names the "
                               "database this outbox belongs to: restore it, or remove it only if you know "
                               "the outbox's outcomes are for the database you point at") from exc


def current(store: IdentityStore, *, embedded: bool = False) -> Binding:
    instance, database, server = store.identity()
    return Binding(instance, database, server, embedded, schema_in_use())


def bind(directory: str, store: IdentityStore, *, embedded: bool = False) -> Binding:
    """Record the store's database as this outbox's at first use; ``WrongDatabase`` when the
    outbox already belongs to another."""
    here = current(store, embedded=embedded)
    recorded = bound_to(directory)
    if recorded is not None and not recorded.same_database(here):
        raise WrongDatabase(f"the outbox {directory} belongs to {recorded.describe()}, not {here.describe()}: "
                            f"{recorded.mend(here)}")
    # Marked embedded by whoever knows it is (a bind that does not know never unmarks it).
    if recorded is None or (embedded and not recorded.embedded):
        schema = recorded.schema if recorded is not None else here.schema
        marked = Binding(here.instance, here.database, here.server, embedded, schema)
        atomic_write(directory, DATABASE_FILE, orjson.dumps({
            "instance": marked.instance, "database": marked.database, "server": marked.server,
            "embedded": marked.embedded, "schema": marked.schema}))
        return marked
    return recorded
