"""Helpers shared by the CLI modules."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import click

from outbox import OutboxError
from shardworker.errors import ShardworkerError


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
    from shardworker.pg_store import PgStore, StoreConfig, redact_dsn

    if dsn:
        return dsn
    from shardworker.embedded import ensure_embedded

    dsn = ensure_embedded(".shardworker")
    click.echo(f"using embedded PostgreSQL {redact_dsn(dsn)} (data in .shardworker/)", err=True)
    if migrate:
        store = PgStore(StoreConfig(dsn))
        try:
            store.migrate()
        finally:
            store.close()
    return dsn
