"""What the CLI modules share: the common options (defined once), one-line errors, and
the DSN (given, or the embedded server's)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import click

from outbox import OutboxError
from shardworker.errors import ShardworkerError

dsn_option = click.option("--dsn", envvar="SHARDWORKER_DSN", default=None,
                          help="PostgreSQL DSN (env SHARDWORKER_DSN). Default: embedded server in .shardworker/.")
outbox_dir_option = click.option("--outbox-dir", envvar="SHARDWORKER_OUTBOX_DIR", default=".shardworker/outbox",
                                 show_default=True, help="Outbox directory (env SHARDWORKER_OUTBOX_DIR).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def one_line_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a ShardworkerError into ``error: <message>`` and exit 1."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ShardworkerError, OutboxError) as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
        except OSError as exc:
            where = f": {exc.filename}" if exc.filename else ""
            click.echo(f"error: {exc.strerror or exc}{where}", err=True)
            sys.exit(1)
    return wrapper


def resolve_dsn(dsn: str | None, *, migrate: bool = True) -> str:
    """The given DSN, or the embedded server's (started if needed, migrated)."""
    if dsn:
        return dsn
    from shardworker.dsn import redact_dsn
    from shardworker.embedded import ensure_embedded
    from shardworker.migrate import apply_migrations

    dsn = ensure_embedded(".shardworker")
    click.echo(f"using embedded PostgreSQL {redact_dsn(dsn)} (data in .shardworker/)", err=True)
    if migrate:
        apply_migrations(dsn)
    return dsn
