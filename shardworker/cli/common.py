"""What the CLI modules share: the common options (defined once), one-line errors, and
the DSN (given, or the embedded server's)."""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import logging
import math
import os
import re
import sys
from collections.abc import Callable
from typing import Any

import click

from outbox import OutboxError
from shardworker.core import logs
from shardworker.core.config import WorkerConfig, duration_seconds
from shardworker.core.limits import MAX_DELAY_S
from shardworker.errors import ShardworkerError


def _use_schema(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """--schema: the jobs' schema for this command and the processes it starts."""
    if value is None:
        return
    from shardworker.store.sql import set_schema

    try:
        ctx.call_on_close(set_schema(value))  # (in-process, as in tests: the process goes back after)
    except ShardworkerError as exc:
        raise click.BadParameter(str(exc).partition(": ")[2] or str(exc)) from None


_dsn = click.option("--dsn", envvar="SHARDWORKER_DSN", default=None,
                    help="PostgreSQL DSN (env SHARDWORKER_DSN). Default: embedded server in .shardworker/.")
_schema = click.option("--schema", envvar="SHARDWORKER_SCHEMA", default=None, expose_value=False, is_eager=True,
                       callback=_use_schema, metavar="NAME",
                       help="The PostgreSQL schema of this app's jobs (env SHARDWORKER_SCHEMA; default shardworker): "
                            "apps with schemas of their own share a database and never see each other's jobs.")


def dsn_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--dsn, and --schema beside it: every command that reaches the database takes both."""
    return _dsn(_schema(fn))
outbox_dir_option = click.option("--outbox-dir", envvar="SHARDWORKER_OUTBOX_DIR",
                                 default=WorkerConfig.default("outbox_dir"),
                                 show_default=True, help="Outbox directory (env SHARDWORKER_OUTBOX_DIR).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")

EMBEDDED_BASE = ".shardworker"  # the embedded server's directory, in the current directory

# The longest duration or timeout any option takes: far beyond any retention, look-back or
# wait, and inside what everything downstream holds: Python's timedelta (999,999,999 days),
# its waits (threading.TIMEOUT_MAX, about 292 years), PostgreSQL's intervals and now()
# minus it (timestamptz starts at 4713 BC).
JOB_ID = click.IntRange(min=1, max=2**63 - 1)  # a job id: a bigint, positive (a usage error, not the database's)
MAX_DURATION_S = MAX_DELAY_S
TOO_LONG = "is beyond the longest duration, 100 years (36525d)"
MAX_PG_TIMEOUT_S = 2_147_483  # statement_timeout: milliseconds in a C int
MAX_NETWORK_TIMEOUT_S = 65_534  # keepalives idle at half of it: Linux takes up to 32767 s





class Duration(click.ParamType):
    """A click option type for durations (see ``duration_seconds``); bad input, or a duration
    over ``MAX_DURATION_S``, is a usage error."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        seconds = float(value) if isinstance(value, int | float) else duration_seconds(str(value))
        if seconds is None:
            self.fail(f"{value!r} is not a duration (like 90s, 30m, 2h, 7d)", param, ctx)
        if not 0 <= seconds <= MAX_DURATION_S:
            self.fail(f"{value!r} {TOO_LONG}", param, ctx)
        return seconds


class Seconds(click.ParamType):
    """A finite number of seconds from ``min_s`` to ``max_s`` (``nan``, ``inf`` and numbers no
    wait or server setting can hold are usage errors, not a worker that never connects)."""

    name = "seconds"

    def __init__(self, min_s: float = 0.0, max_s: float = MAX_DURATION_S) -> None:
        self.min_s, self.max_s = min_s, max_s

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = math.nan
        if not self.min_s <= seconds <= self.max_s:  # false for nan too
            self.fail(f"{value!r} is not a number of seconds from {self.min_s:g} to {self.max_s:g}", param, ctx)
        return seconds


class Utf8Text(click.ParamType):
    """Text that must be valid UTF-8 (a kind, queue or key): argv bytes that are not arrive
    as surrogate escapes, which PostgreSQL could never store or match; a usage error."""

    name = "text"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            self.fail(f"{text!a} is not valid UTF-8", param, ctx)
        return text


UTF8 = Utf8Text()


def one_line_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a ShardworkerError into ``error: <message>`` and exit 1."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ShardworkerError, OutboxError) as exc:
            _fail(str(exc))
        except BrokenPipeError:
            # `shardworker jobs list | head`: the reader left; say nothing, as other tools do.
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(141)
        except OSError as exc:
            where = f": {exc.filename}" if exc.filename else ""
            _fail(f"{exc.strerror or exc}{where}")
    return wrapper


def _fail(message: str) -> None:
    """``error: <message>`` on stderr (a JSON record when logs are JSON) and exit 1."""
    if logs.current().format == "json":
        logging.getLogger("shardworker.cli.main").error(message)
    else:
        click.echo(f"error: {message}", err=True)
    sys.exit(1)


def resolve_dsn(dsn: str | None, *, migrate: bool = True, start: bool = True) -> str:
    """The given DSN, or the embedded server's (migrated; created and started when ``start``,
    else an ``EmbeddedNotRunning`` error that says how to start it: a command that only reads
    leaves a stopped server stopped)."""
    if dsn:
        scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", dsn)
        if scheme and scheme.group(1).lower() not in ("postgresql", "postgres"):
            raise click.BadParameter(f"{scheme.group(1)}:// is not a PostgreSQL DSN (expected "
                                     "postgresql://user:password@host:port/dbname, or key=value pairs)",
                                     param_hint="--dsn")
        return dsn
    from shardworker.core.config import DEFAULT_SCHEMA
    from shardworker.core.dsn import redact_dsn
    from shardworker.embedded import ensure_embedded, running_embedded
    from shardworker.store.migrate import apply_migrations
    from shardworker.store.sql import current_schema

    dsn = ensure_embedded(EMBEDDED_BASE) if start else running_embedded(EMBEDDED_BASE)
    note(f"using embedded PostgreSQL {redact_dsn(dsn)} (data in .shardworker/)")
    if migrate and current_schema() == DEFAULT_SCHEMA:  # another is made by `migrate --schema` only: a typo
        apply_migrations(dsn)                           # would otherwise make a schema no worker reads
    return dsn


def schema_hint(dsn: str) -> str:
    """When a command found nothing: the other schemas of the database that hold jobs, in case
    its --schema is missing or wrong (" (schema shardworker; ...: give --schema)"); else ""."""
    from shardworker.store.sql import current_schema

    try:
        from shardworker.store.job_queries import other_schemas

        found = other_schemas(dsn)
    except Exception:  # only a hint: never in the way of the command's own answer
        return ""
    if not found:
        return ""
    return f" (in schema {current_schema()}; this database holds others: {', '.join(found)}: give --schema)"


def note(message: str, **fields: Any) -> None:
    """A line for the operator on stderr: a log record when logs are JSON (so every line
    parses), a plain line otherwise."""
    if logs.current().format == "json":
        logging.getLogger("shardworker.cli.main").info(message, extra=fields)
    else:
        click.echo(message, err=True)


LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "::1", "[::1]"]  # the names of this machine's loopback


def is_loopback(host: str) -> bool:
    """Whether binding to ``host`` (an address or a name) keeps a port on this machine: a
    name other than ``localhost`` may resolve to any interface."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
