"""The checks of ``shardworker doctor`` that see the database as production does: a held xmin
horizon, the jobs table's dead rows, and connections near ``max_connections``. Each job
leaves dead rows behind (queued, running, done are updates); while a long transaction or a
replication slot holds the horizon, vacuum removes none of them, claims walk ever more dead
index entries, and throughput falls while the backlog grows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardworker.core.config import HORIZON_WARN_S
from shardworker.doctor.report import Check, Status, attempt

if TYPE_CHECKING:
    from shardworker.store.pg_store import PgStore
    from shardworker.store.production import Connections, HorizonHolder, JobsTuples, SlotHolder

DEAD_TUPLES_FLOOR = 1000  # fewer dead rows than this are never worth a warning, whatever the live count
CONNECTIONS_WARN = 0.8  # of max_connections


@dataclass(frozen=True)
class ProductionFacts:
    """What the server said; None where a fact could not be read (no privilege, no table)."""

    holders: list[HorizonHolder] | None
    slots: list[SlotHolder] | None
    tuples: JobsTuples | None
    connections: Connections | None


def gather_production(store: PgStore) -> ProductionFacts:
    holders, _ = attempt(store.horizon_holders)
    slots, _ = attempt(store.slot_holders)
    tuples, _ = attempt(store.jobs_tuples)
    connections, _ = attempt(store.connections)
    return ProductionFacts(holders, slots, tuples, connections)


def _age(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min" if seconds >= 60 \
        else f"{seconds:.0f} s"


def check_horizon(holders: list[HorizonHolder], slots: list[SlotHolder], warn_s: float = HORIZON_WARN_S) -> Check:
    """Warn for a transaction open longer than ``warn_s`` (naming its pid, application and
    age) and for a replication slot no one reads that holds an xmin (naming the slot)."""
    old = [h for h in holders if h.age_s > warn_s]
    stuck = [s for s in slots if not s.active]
    data = {"transactions": [h._asdict() for h in old], "slots": [s._asdict() for s in stuck],
            "threshold_s": warn_s}
    if not old and not stuck:
        oldest = f"oldest transaction {_age(holders[0].age_s)}" if holders else "no open transaction"
        return Check("horizon", Status.OK, f"{oldest}, no inactive slot holds it", None, data)
    parts = [f"pid {h.pid} ({h.application or 'no application_name'}, {h.state}, database {h.database}) "
             f"has had a transaction open for {_age(h.age_s)}" for h in old[:3]]
    parts += [f"inactive {s.slot_type} replication slot {s.name} holds an xmin {s.xid_age} transactions old"
              for s in stuck[:3]]
    return Check("horizon", Status.WARN, "the xmin horizon is held: " + "; ".join(parts) + ": vacuum removes no "
                 "dead job rows meanwhile and claims slow down",
                 "end that transaction (commit it, or SELECT pg_terminate_backend(pid)); set "
                 "idle_in_transaction_session_timeout; drop a slot no one reads (pg_drop_replication_slot)", data)


def check_dead_tuples(tuples: JobsTuples) -> Check:
    data = {"live": tuples.live, "dead": tuples.dead,
            "last_vacuum": tuples.last_vacuum.isoformat() if tuples.last_vacuum else None}
    from shardworker.store.sql import current_schema

    table = f"{current_schema()}.jobs"
    text = f"{table}: {tuples.dead} dead rows, {tuples.live} live"
    if tuples.dead > max(tuples.live, DEAD_TUPLES_FLOOR):
        return Check("dead-rows", Status.WARN, text + " (more dead than live: claims walk the dead ones)",
                     f"check the horizon check above; VACUUM {table}; make autovacuum visit it sooner "
                     f"(ALTER TABLE {table} SET (autovacuum_vacuum_scale_factor = 0.01)); prune finished "
                     "jobs (--retention)", data)
    return Check("dead-rows", Status.OK, text, None, data)


def check_connections(conns: Connections, warn: float = CONNECTIONS_WARN) -> Check:
    data = {"open": conns.open, "max_connections": conns.max, "reserved": conns.reserved}
    text = f"{conns.open} of max_connections {conns.max} open"
    if conns.open > warn * conns.max:
        return Check("connections", Status.WARN, text + f" (over {warn:.0%}): new workers and clients will be "
                     "refused", "raise max_connections, run fewer workers per database, or put PgBouncer "
                     "(transaction mode) in front and give workers --listen-dsn (docs/operating.md)", data)
    return Check("connections", Status.OK, text, None, data)


def production_checks(facts: ProductionFacts, horizon_warn_s: float = HORIZON_WARN_S) -> list[Check]:
    """The checks whose facts could be read."""
    checks = []
    if facts.holders is not None:
        checks.append(check_horizon(facts.holders, facts.slots or [], horizon_warn_s))
    if facts.tuples is not None:
        checks.append(check_dead_tuples(facts.tuples))
    if facts.connections is not None:
        checks.append(check_connections(facts.connections))
    return checks
