"""``shardworker doctor``: one line per check (``ok``, ``warn``, ``FAIL`` with what to do), or
``--json``; exit 1 when a check needs action. The checks live in ``shardworker.doctor``."""

from __future__ import annotations

import sys

import click
import orjson

from shardworker.cli.common import (
    EMBEDDED_BASE,
    Seconds,
    dsn_option,
    json_option,
    one_line_errors,
    outbox_dir_option,
    resolve_dsn,
)
from shardworker.core.config import HORIZON_WARN_S, WorkerConfig

_MiB = 1024 * 1024


@click.command()
@outbox_dir_option
@click.option("--min-free-mb", type=click.IntRange(min=0), default=WorkerConfig.min_free_bytes // _MiB,
              show_default=True, help="Free space the outbox disk needs (as `run --min-free-mb`).")
@click.option("--horizon-age", type=Seconds(1), default=HORIZON_WARN_S, show_default=True,
              help="Seconds a transaction may hold the xmin horizon (keep vacuum from removing dead job "
                   "rows) before it is named.")
@json_option
@dsn_option
@click.pass_context
@one_line_errors
def doctor(ctx: click.Context, outbox_dir: str, min_free_mb: int, horizon_age: float, as_json: bool,
           dsn: str | None) -> None:
    """Check the schema, the database, the outbox directory and the clocks; exit 1 when action is needed."""
    from shardworker.doctor import Status, diagnose, needs_action

    given = ctx.get_parameter_source("outbox_dir") in (click.core.ParameterSource.COMMANDLINE,
                                                      click.core.ParameterSource.ENVIRONMENT)
    checked, dsn_error, dsn_action = _doctor_dsn(dsn)
    checks = diagnose(checked, outbox_dir, outbox_dir_given=given, min_free_bytes=min_free_mb * _MiB,
                      embedded=not dsn, dsn_error=dsn_error, dsn_action=dsn_action, horizon_warn_s=horizon_age)
    failing = needs_action(checks)
    if as_json:
        click.echo(orjson.dumps({"needs_action": failing, "checks": [c.as_json() for c in checks]}).decode())
    else:
        for check in checks:
            click.echo(check.line())
        fails = sum(c.status is Status.FAIL for c in checks)
        warns = sum(c.status is Status.WARN for c in checks)
        click.echo(f"{fails} check(s) need action, {warns} warning(s)" if fails
                   else f"nothing needs action ({warns} warning(s))", err=True)
    if failing:
        sys.exit(1)


def _doctor_dsn(dsn: str | None) -> tuple[str | None, str | None, str | None]:
    """The DSN to check, or None, why and what to do: without --dsn, the embedded server only
    while it runs (doctor never creates or starts a server, and never migrates one)."""
    from shardworker.embedded import EmbeddedNotRunning
    from shardworker.errors import ShardworkerError

    if dsn:
        return dsn, None, None
    try:
        return resolve_dsn(None, migrate=False, start=False), None, None
    except EmbeddedNotRunning as exc:
        return None, exc.state, exc.hint
    except ShardworkerError as exc:
        return None, f"the embedded server under {EMBEDDED_BASE}/ cannot be used: {exc}", None
