"""``shardworker doctor``: is this host's worker set up to keep its promise, and if not, what to do.

Two kinds of function: ``gather_database`` and ``gather_outbox`` read facts (the database
through the store, with a bounded connect timeout; the outbox directory without any lock and
without writing), and the ``check_*`` functions turn facts into ``Check`` values, pure and
unit-testable. ``diagnose`` runs them all. The database being down never stops the outbox
checks: they need no database. The database's checks live in ``checks_database`` (those of a production server's state,
the held horizon, dead rows and connections, in ``checks_production``), the
outbox's in ``checks_outbox``, ``Check`` and ``Status`` in ``report``; this package
re-exports them.

Severity: ``FAIL`` needs action (the command exits 1), ``warn`` deserves a look but needs
nothing now (a silent worker is rescued by its peers; a skewed clock only shifts what the
operator reads), ``ok`` is fine.
"""

from __future__ import annotations

import outbox
from shardworker.core.config import HORIZON_WARN_S
from shardworker.doctor.checks_database import (
    CLOCK_SKEW_WARN_S,
    CONNECT_TIMEOUT_S,
    SILENT_AFTER_S,
    DatabaseFacts,
    check_clock,
    check_database,
    check_kinds,
    check_schema,
    check_workers,
    check_writable,
    database_checks,
    gather_database,
)
from shardworker.doctor.checks_outbox import (
    PENDING_AGE_WARN_S,
    MiB,
    OutboxFacts,
    check_binding,
    check_free_space,
    check_outbox_dir,
    check_pending,
    check_permissions,
    check_quarantine,
    gather_outbox,
    outbox_checks,
)
from shardworker.doctor.checks_production import check_connections, check_dead_tuples, check_horizon
from shardworker.doctor.report import Check, Status, needs_action


def diagnose(dsn: str | None, outbox_dir: str, *, outbox_dir_given: bool, min_free_bytes: int,
             embedded: bool = False, dsn_error: str | None = None, dsn_action: str | None = None,
             horizon_warn_s: float = HORIZON_WARN_S) -> list[Check]:
    """Every check, the database's first. ``dsn_error``: why there is no database to check,
    ``dsn_action``: what to do about it (default: pass --dsn); ``horizon_warn_s``: how long a
    transaction may hold the xmin horizon before it is named."""
    db = (gather_database(dsn, embedded=embedded) if dsn
          else DatabaseFacts(None, error=dsn_error or "no DSN", action=dsn_action))
    checks = database_checks(db, horizon_warn_s)
    try:
        facts = gather_outbox(outbox_dir)
    except (OSError, outbox.OutboxError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return [*checks, Check("outbox", Status.FAIL, f"cannot read {outbox_dir}: {reason}",
                               "run doctor as the user the worker runs as")]
    return checks + outbox_checks(facts, given=outbox_dir_given, min_free_bytes=min_free_bytes,
                                  here=db.identity, reachable=db.error is None, marks=db.marks)


__all__ = [
    "CLOCK_SKEW_WARN_S",
    "CONNECT_TIMEOUT_S",
    "HORIZON_WARN_S",
    "PENDING_AGE_WARN_S",
    "SILENT_AFTER_S",
    "Check",
    "DatabaseFacts",
    "MiB",
    "OutboxFacts",
    "Status",
    "check_binding",
    "check_clock",
    "check_connections",
    "check_database",
    "check_dead_tuples",
    "check_free_space",
    "check_horizon",
    "check_kinds",
    "check_outbox_dir",
    "check_pending",
    "check_permissions",
    "check_quarantine",
    "check_schema",
    "check_workers",
    "check_writable",
    "database_checks",
    "diagnose",
    "gather_database",
    "gather_outbox",
    "needs_action",
    "outbox_checks",
]
