"""The database's checks for ``shardworker doctor``: ``gather_database`` reads the facts (one
bounded connection, nothing written) and the ``check_*`` functions judge them: reachable,
writable, schema version, clock skew, silent workers, queued kinds no live worker serves, and
the production checks of ``checks_production``."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardworker.core import binding
from shardworker.core.binding import Binding
from shardworker.core.counts import unserved_text
from shardworker.core.dsn import redact_dsn
from shardworker.core.limits import SILENT_AFTER_S
from shardworker.core.views import UnservedKind, WorkerInfo
from shardworker.doctor.checks_production import HORIZON_WARN_S, ProductionFacts, gather_production, production_checks
from shardworker.doctor.report import Check, Status, attempt
from shardworker.errors import ShardworkerError
from shardworker.store.schema import available_migrations
from shardworker.worker.identity import pid_alive

if TYPE_CHECKING:
    from shardworker.store.schema_queries import ServerState

CLOCK_SKEW_WARN_S = 5.0  # periodic ticks and heartbeats use the database's clock, outbox ages this host's
CONNECT_TIMEOUT_S = 3  # a black-holed server is reported within ~3 s, not libpq's default of forever


@dataclass(frozen=True)
class DatabaseFacts:
    """What the database said; ``error`` set when it could not be reached at all."""

    where: str | None  # the DSN, password hidden; None when there is none to check
    error: str | None = None
    state: ServerState | None = None
    versions: set[int] | None = None
    schema_error: str | None = None
    workers: list[WorkerInfo] | None = None  # None: not readable (no schema, or one too old)
    identity: Binding | None = None
    unserved: list[UnservedKind] | None = None  # None: not readable
    action: str | None = None  # what to do when there is no database to check
    production: ProductionFacts | None = None
    marks: dict[str, int] | None = None  # each outbox's batch count as the database holds it; None: unreadable


def gather_database(dsn: str, *, embedded: bool = False, connect_timeout_s: int = CONNECT_TIMEOUT_S) -> DatabaseFacts:
    """Connect once (bounded), read the server's state, schema, workers and identity; write nothing."""
    from shardworker.store.pg_store import PgStore, StoreConfig

    where = redact_dsn(dsn)
    store = PgStore(StoreConfig(dsn=dsn, connect_timeout_s=connect_timeout_s, statement_timeout_s=10.0,
                                network_timeout_s=connect_timeout_s * 2))
    try:
        try:
            state = store.server_state()
        except ShardworkerError as exc:
            return DatabaseFacts(where, error=str(exc))
        versions, schema_error = attempt(store.schema_versions)
        workers, _ = attempt(store.workers)
        identity, _ = attempt(lambda: binding.current(store, embedded=embedded))
        unserved, _ = attempt(store.unserved_kinds)
        marks, _ = attempt(store.all_marks)
        return DatabaseFacts(where, None, state, versions, schema_error, workers, identity, unserved,
                             production=gather_production(store), marks=marks)
    finally:
        store.close()


def check_database(facts: DatabaseFacts) -> Check:
    if facts.where is None:
        return Check("database", Status.FAIL, f"not checked: {facts.error}",
                     facts.action or "pass --dsn (or set SHARDWORKER_DSN)", {"reachable": None})
    if facts.error is not None:
        reason = facts.error.removeprefix("database unavailable: ")
        return Check("database", Status.FAIL, f"unreachable at {facts.where}: {reason}",
                     "start PostgreSQL or fix --dsn (SHARDWORKER_DSN); the worker keeps outcomes in the outbox "
                     "meanwhile", {"reachable": False})
    return Check("database", Status.OK, f"reachable at {facts.where}", None, {"reachable": True})


def check_writable(state: ServerState) -> Check:
    """A standby or a read-only server cannot take outcomes: the flusher would wait for ever."""
    if state.in_recovery:
        return Check("writable", Status.FAIL, "the server is a standby (in recovery)",
                     "point --dsn at the primary", {"writable": False})
    if state.read_only:
        return Check("writable", Status.FAIL, "transactions are read-only (default_transaction_read_only)",
                     "point --dsn at a writable primary, or reset default_transaction_read_only",
                     {"writable": False})
    return Check("writable", Status.OK, "primary, read-write", None, {"writable": True})


def check_schema(versions: set[int] | None, error: str | None = None) -> Check:
    known = {m.version for m in available_migrations()}
    needed = max(known)
    if versions is None:
        why = error or "no shardworker schema in this database"
        return Check("schema", Status.FAIL, why.removesuffix(": run `shardworker migrate`"),
                     "run `shardworker migrate`", {"applied": None, "needed": needed})
    current = max(versions, default=0)
    data = {"applied": current, "needed": needed}
    missing = sorted(known - versions)
    if missing:
        return Check("schema", Status.FAIL, f"at version {current}, this code needs {needed} (missing "
                     f"{', '.join(map(str, missing))})", "run `shardworker migrate`", data)
    unknown = sorted(versions - known)
    if unknown:
        return Check("schema", Status.WARN, f"the database has migrations this code does not know "
                     f"({', '.join(map(str, unknown))})", "upgrade shardworker on this host", data)
    return Check("schema", Status.OK, f"version {current} (every migration applied)", None, data)


def check_clock(state: ServerState, warn_s: float = CLOCK_SKEW_WARN_S) -> Check:
    """Skew = the server's clock minus this host's at the midpoint of the round trip, which
    bounds the error to half the round trip."""
    skew = state.server_time - (state.sent_at + state.received_at) / 2
    margin = (state.received_at - state.sent_at) / 2
    data = {"skew_s": round(skew, 3), "uncertainty_s": round(margin, 3)}
    text = f"{abs(skew):.3f} s {'ahead of' if skew > 0 else 'behind'} this host (+-{margin:.3f} s)"
    if abs(skew) - margin > warn_s:
        return Check("clock", Status.WARN, f"the database's clock is {text}",
                     "sync both clocks (NTP): periodic jobs and heartbeats follow the database's clock, "
                     "outbox ages this host's", data)
    return Check("clock", Status.OK, f"database {text}", None, data)


def check_workers(rows: list[WorkerInfo], silent_after_s: float = SILENT_AFTER_S, *,
                  host: str | None = None, alive: Callable[[int], bool] | None = None) -> Check:
    """Workers silent for ``silent_after_s``, and, before that, those of this ``host`` whose
    process is gone (killed: their row beat a moment ago, their jobs read running)."""
    host = socket.gethostname() if host is None else host
    alive = pid_alive if alive is None else alive
    silent = [r for r in rows if r.silent_s > silent_after_s]
    gone = [r for r in rows if r not in silent and r.hostname == host and r.pid > 0 and not alive(r.pid)]
    data = {"workers": len(rows), "silent": [r.worker_id for r in silent], "gone": [r.worker_id for r in gone]}
    if gone:
        names = ", ".join(f"{r.worker_id} (pid {r.pid}) is gone, {r.jobs_running or 0} job(s) running under it"
                          for r in gone[:5])
        return Check("workers", Status.WARN, f"on this host {names}",
                     "restart the worker on its outbox (its start recovers those jobs), or run `shardworker outbox "
                     "drain` on its outbox; if neither, peers rescue them after --rescue-after", data)
    if not silent:
        return Check("workers", Status.OK, f"{len(rows)} registered, none silent", None, data)
    names = ", ".join(f"{r.worker_id} on {r.hostname} ({r.silent_s:.0f} s)" for r in silent[:5])
    more = f" and {len(silent) - 5} more" if len(silent) > 5 else ""
    return Check("workers", Status.WARN, f"{len(silent)} of {len(rows)} silent for over {silent_after_s:.0f} s: "
                 f"{names}{more}", "check those hosts; restart a stopped worker there (its outbox is drained at "
                 "start); a host gone for good has its running jobs rescued after --rescue-after", data)


def check_kinds(unserved: list[UnservedKind]) -> Check:
    """Queued jobs of a kind no live worker serves wait unseen: a typo in a kind, a worker not
    deployed yet, or one gone. A warning: the worker may be on its way."""
    data = {"unserved": [row.to_json() for row in unserved]}
    if not unserved:
        return Check("kinds", Status.OK, "every queued kind has a live worker", None, data)
    names = "; ".join(unserved_text(row) for row in unserved[:5])
    more = f"; and {len(unserved) - 5} more" if len(unserved) > 5 else ""
    return Check("kinds", Status.WARN, f"no live worker handles {names}{more}",
                 "start a worker with handlers for them (in those queues), or fix the kind's spelling where "
                 "it is enqueued (`enqueue --strict` refuses such kinds)", data)


def database_checks(facts: DatabaseFacts, horizon_warn_s: float = HORIZON_WARN_S) -> list[Check]:
    """The database's checks; only the first when it is unreachable (the rest need it)."""
    checks = [check_database(facts)]
    if facts.state is None:
        return checks
    checks += [check_writable(facts.state), check_schema(facts.versions, facts.schema_error),
               check_clock(facts.state)]
    if facts.workers is not None:
        checks.append(check_workers(facts.workers))
    if facts.unserved is not None:
        checks.append(check_kinds(facts.unserved))
    if facts.production is not None:
        checks += production_checks(facts.production, horizon_warn_s)
    return checks
