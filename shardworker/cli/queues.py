"""``shardworker queues [pause|resume|limit]``: each queue's backlog, and its state across
every worker (paused, limits), set at run time.

Thin commands over ``shardworker.queues``; each takes ``--json``, and ``--dsn`` either on
the group or on the command. Bad input (a bad name or rate, ``--clear`` with a limit, or
nothing to set) is a usage error: one line, exit 2, nothing written.
"""

from __future__ import annotations

from typing import Any

import click
import orjson
from click.core import ParameterSource

from shardworker import queues as queues_api
from shardworker.cli.common import dsn_option, json_option, one_line_errors, resolve_dsn
from shardworker.core import counts
from shardworker.core.flow import Rate, parse_rate
from shardworker.core.views import QueueInfo, QueueState
from shardworker.errors import ConfigError

COLUMNS = ("queue", "paused", "concurrency", "rate", "per key", "available", "scheduled", "prefetched", "running",
           "oldest")


class QueueName(click.ParamType):
    """A queue's name, checked as ``shardworker.queues`` checks it."""

    name = "name"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return queues_api.check_name(value)
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


class RateType(click.ParamType):
    """A rate: ``N/s``, ``N/m`` or ``N/h``."""

    name = "rate"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Rate:
        try:
            return value if isinstance(value, Rate) else parse_rate(value)
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


def _from_group(ctx: click.Context, dsn: str | None, as_json: bool) -> tuple[str, bool]:
    """The DSN and --json of this command, where a ``--dsn`` typed on the group (``queues --dsn X
    pause q``) wins over ``SHARDWORKER_DSN``, as the command's own would."""
    group = ctx.parent
    if group is not None:
        typed = group.get_parameter_source("dsn") == ParameterSource.COMMANDLINE
        if typed and ctx.get_parameter_source("dsn") != ParameterSource.COMMANDLINE:
            dsn = group.params["dsn"]
        as_json = as_json or bool(group.params.get("as_json"))
    return resolve_dsn(dsn), as_json


@click.group(invoke_without_command=True)
@json_option
@dsn_option
@click.pass_context
@one_line_errors
def queues(ctx: click.Context, as_json: bool, dsn: str | None) -> None:
    """Each queue: paused, limits, jobs available (due), scheduled (later), prefetched (claimed,
    not started), running (started), and the oldest available job's age; then every limit
    across workers (kinds' and queues') with what uses it now."""
    if ctx.invoked_subcommand is not None:
        return
    dsn = resolve_dsn(dsn, start=False)
    found = queues_api.list_queues(dsn)
    if as_json:
        click.echo(orjson.dumps([_info_json(q) for q in found]).decode())
        return
    if not found:
        click.echo("no queues (no jobs queued or running, no queue paused or limited)")
        return
    rows = [COLUMNS, *(_row(q) for q in found)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    for row in rows:
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1]),
                 *(cell.rjust(width) for cell, width in zip(row[2:], widths[2:], strict=True))]
        click.echo("  ".join(cells).rstrip())
    for q in found:
        if q.key_weights:
            click.echo(f"queue {q.name}: keys' weights " + " ".join(f"{k}={w}" for k, w in sorted(q.key_weights.items())))
    _echo_limits(dsn)


def _echo_limits(dsn: str) -> None:
    """Every limit across workers, a line each, after the queues (a kind's limits are in no
    queue's row)."""
    from shardworker.store.queue_queries import limits_in_use

    limits = limits_in_use(dsn)
    if limits:
        click.echo("limits across workers (in use/limit):")
        for limit in limits:
            click.echo(f"  {limit.text()}{'  FULL' if limit.full else ''}")


def _row(q: QueueInfo) -> tuple[str, ...]:
    return (q.name, "yes" if q.paused else "no", _or_dash(q.concurrency), _or_dash(q.rate),
            _or_dash(q.key_concurrency), str(q.available),
            str(q.scheduled), str(q.prefetched), str(q.running),
            "-" if q.oldest_available_s is None else counts.age_text(q.oldest_available_s))


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def _info_json(q: QueueInfo) -> dict[str, Any]:
    fields = q.to_json()
    return {"queue": fields.pop("name"), **fields}


def _echo_state(state: QueueState, as_json: bool, done: str | None = None) -> None:
    if as_json:
        rate = None if state.rate is None else str(state.rate)
        click.echo(orjson.dumps({"queue": state.name, "paused": state.paused, "concurrency": state.concurrency,
                                 "rate": rate, "key_concurrency": state.key_concurrency,
                                 "key_weights": state.key_weights}).decode())
    elif done is not None:
        click.echo(f"queue {state.name} {done}")
    else:
        limits = [f"{label} {value}" for label, value in (("concurrency", state.concurrency), ("rate", state.rate),
                                                          ("key concurrency", state.key_concurrency))
                  if value is not None]
        if state.key_weights:
            limits.append("weights " + " ".join(f"{k}={w}" for k, w in sorted(state.key_weights.items())))
        click.echo(f"queue {state.name}: {', '.join(limits) or 'no limits'}{' (paused)' if state.paused else ''}")


@queues.command("pause")
@click.argument("name", type=QueueName())
@json_option
@dsn_option
@click.pass_context
@one_line_errors
def pause_command(ctx: click.Context, name: str, as_json: bool, dsn: str | None) -> None:
    """Stop every worker claiming NAME's jobs (running ones finish); limits stay."""
    dsn, as_json = _from_group(ctx, dsn, as_json)
    _echo_state(queues_api.pause(dsn, name), as_json, "paused")


@queues.command("resume")
@click.argument("name", type=QueueName())
@json_option
@dsn_option
@click.pass_context
@one_line_errors
def resume_command(ctx: click.Context, name: str, as_json: bool, dsn: str | None) -> None:
    """Let workers claim NAME's jobs again; limits stay."""
    dsn, as_json = _from_group(ctx, dsn, as_json)
    _echo_state(queues_api.resume(dsn, name), as_json, "resumed")


@queues.command("limit")
@click.argument("name", type=QueueName())
@click.option("--concurrency", type=click.IntRange(1, queues_api.MAX_CONCURRENCY), default=None,
              help="At most K of NAME's jobs running at once, across every worker.")
@click.option("--rate", type=RateType(), default=None,
              help="At most N of NAME's jobs starting per second, minute or hour (10/s, 600/m, 1000/h).")
@click.option("--key-concurrency", type=click.IntRange(1, queues_api.MAX_CONCURRENCY), default=None,
              help="At most K of NAME's jobs of one key (a tenant's) running at once, across every worker; "
                   "other keys' jobs run meanwhile.")
@click.option("--weight", "weights", multiple=True, metavar="KEY=W",
              help="When keys take turns, W of KEY's jobs to each other key's one (repeatable; 1 by default).")
@click.option("--clear", is_flag=True, help="Remove every limit (and the weights).")
@json_option
@dsn_option
@click.pass_context
@one_line_errors
def limit_command(ctx: click.Context, name: str, concurrency: int | None, rate: Rate | None,
                  key_concurrency: int | None, weights: tuple[str, ...], clear: bool, as_json: bool,
                  dsn: str | None) -> None:
    """Set NAME's limits across workers (a limit not given stays), or --clear them."""
    if clear and (concurrency is not None or rate is not None or key_concurrency is not None or weights):
        raise click.UsageError("--clear removes every limit: give it alone, or give the limits to set")
    if not clear and concurrency is None and rate is None and key_concurrency is None and not weights:
        raise click.UsageError("give --concurrency, --key-concurrency, --rate, --weight or --clear")
    parsed: dict[str, int] = {}
    for text in weights:
        key, sep, value = text.rpartition("=")
        if not sep or not key or not value.strip().isdigit() or not 1 <= int(value) <= queues_api.MAX_WEIGHT:
            raise click.BadParameter(f"{text!r}: expected KEY=W, a key and a whole number from 1 to "
                                     f"{queues_api.MAX_WEIGHT} (acme=3)", param_hint="--weight")
        parsed[key] = int(value)
    dsn, as_json = _from_group(ctx, dsn, as_json)
    _echo_state(queues_api.limit(dsn, name, concurrency=concurrency, rate=rate, clear=clear,
                                 key_concurrency=key_concurrency, weights=parsed or None), as_json)
