"""``shardworker events send KEY [PAYLOAD]``: send an event from the command line (an operator
approving a job by hand, a script, a webhook relay): it wakes every job waiting on ``KEY``
(``job.wait_event``) and is kept for ``run --event-retention`` for waits still to come."""

from __future__ import annotations

import click
import orjson

from shardworker.cli.common import UTF8, dsn_option, json_option, one_line_errors, resolve_dsn
from shardworker.errors import EventError


@click.group()
def events() -> None:
    """Send events to jobs that wait for them (job.wait_event)."""


@events.command("send")
@click.argument("key", type=UTF8)
@click.argument("payload", required=False, default="null")
@json_option
@dsn_option
@one_line_errors
def send_command(key: str, payload: str, as_json: bool, dsn: str | None) -> None:
    """Send an event to KEY with PAYLOAD (JSON text; none: null; -: read it from stdin). Every
    job waiting on KEY runs again with it; a job that starts waiting on KEY later takes it too."""
    from shardworker.events import send_event

    if payload == "-":
        payload = click.get_text_stream("stdin").read()
    try:
        value = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise EventError(f"PAYLOAD is not JSON ({exc}); quote a string as '\"text\"'") from None
    woken = send_event(resolve_dsn(dsn, start=False), key, value)
    click.echo(orjson.dumps({"key": key, "woken": woken}).decode() if as_json
               else f"event {key!r} sent: {woken} waiting job{'' if woken == 1 else 's'} woken")
