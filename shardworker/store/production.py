"""What a production database does to a queue, read for ``shardworker doctor``: sessions and
replication slots that hold the xmin horizon back (vacuum then keeps every dead row), the
jobs table's dead rows against its live ones, and the connections open against
``max_connections``. Read-only, on one session; each reader returns plain values."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from shardworker.store.connection import Session
from shardworker.store.sql import query


class HorizonHolder(NamedTuple):
    """A session whose snapshot (or transaction id) holds the horizon."""

    pid: int
    application: str
    state: str
    database: str
    age_s: float


class SlotHolder(NamedTuple):
    """A replication slot whose xmin or catalog_xmin holds the horizon."""

    name: str
    slot_type: str
    active: bool
    xid_age: int


class JobsTuples(NamedTuple):
    live: int
    dead: int
    last_vacuum: datetime | None


class Connections(NamedTuple):
    open: int
    max: int
    reserved: int  # superuser_reserved_connections: not for ordinary roles


class ProductionQueries(Session):
    """The doctor's reads of the server's production state."""

    def horizon_holders(self) -> list[HorizonHolder]:
        """The oldest open transactions of other sessions, oldest first (up to 5)."""
        with self.cursor() as cur:
            cur.execute(query("doctor_oldest_transactions"))
            return [HorizonHolder(int(p), str(a), str(s), str(d), float(age)) for p, a, s, d, age in cur.fetchall()]

    def slot_holders(self) -> list[SlotHolder]:
        with self.cursor() as cur:
            cur.execute(query("doctor_slots_holding"))
            return [SlotHolder(str(n), str(t), bool(a), int(age)) for n, t, a, age in cur.fetchall()]

    def jobs_tuples(self) -> JobsTuples:
        with self.cursor() as cur:
            cur.execute(query("doctor_jobs_tuples"))
            row = cur.fetchone()
        assert row is not None
        return JobsTuples(int(row[0]), int(row[1]), row[2])

    def connections(self) -> Connections:
        with self.cursor() as cur:
            cur.execute(query("doctor_connections"))
            row = cur.fetchone()
        assert row is not None
        return Connections(int(row[0]), int(row[1]), int(row[2]))
