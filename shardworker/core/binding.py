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

    def describe(self) -> str:
        return f"database {self.database!r} on {self.server} (instance {self.instance[:8]})"

    def same_database(self, other: Binding) -> bool:
        return (self.instance, self.database) == (other.instance, other.database)


def bound_to(directory: str) -> Binding | None:
    """The binding recorded in ``directory``, or None before its first use."""
    try:
        doc = orjson.loads(read_small(os.path.join(directory, DATABASE_FILE)))
        return Binding(str(doc["instance"]), str(doc["database"]), str(doc["server"]), bool(doc["embedded"]))
    except FileNotFoundError:
        return None
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise ShardworkerError(f"{os.path.join(directory, DATABASE_FILE)} is damaged ({exc}); it names the "
                               "database this outbox belongs to: restore it, or remove it only if you know "
                               "the outbox's outcomes are for the database you point at") from exc


def current(store: IdentityStore, *, embedded: bool = False) -> Binding:
    instance, database, server = store.identity()
    return Binding(instance, database, server, embedded)


def bind(directory: str, store: IdentityStore, *, embedded: bool = False) -> Binding:
    """Record the store's database as this outbox's at first use; ``WrongDatabase`` when the
    outbox already belongs to another."""
    here = current(store, embedded=embedded)
    recorded = bound_to(directory)
    if recorded is not None and not recorded.same_database(here):
        if (recorded.database, recorded.server) == (here.database, here.server):  # another schema of it, likely
            raise WrongDatabase(f"the outbox {directory} belongs to the jobs of instance {recorded.instance[:8]} in "
                                f"database {here.database!r} on {here.server}, not to those of instance "
                                f"{here.instance[:8]}: another schema of the same database (give the --schema its "
                                "jobs are in), or a database made anew")
        raise WrongDatabase(f"the outbox {directory} belongs to {recorded.describe()}, not {here.describe()}: "
                            "point --dsn at the database it belongs to")
    # Marked embedded by whoever knows it is (a bind that does not know never unmarks it).
    if recorded is None or (embedded and not recorded.embedded):
        marked = Binding(here.instance, here.database, here.server, embedded)
        atomic_write(directory, DATABASE_FILE, orjson.dumps({
            "instance": marked.instance, "database": marked.database, "server": marked.server,
            "embedded": marked.embedded}))
        return marked
    return recorded
