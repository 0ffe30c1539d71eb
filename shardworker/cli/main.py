"""The ``shardworker`` command line: thin click commands over library functions.

Every command takes ``--dsn`` (env ``SHARDWORKER_DSN``); without one it starts or
reuses an embedded PostgreSQL under ``.shardworker/`` and says so. Exit codes: 0 success,
1 operational error (one line, no traceback), 2 usage error.
"""

from __future__ import annotations

import logging
from typing import Any

import click
import orjson

from shardworker.cli.common import (
    UTF8,
    Duration,
    dsn_option,
    json_option,
    note,
    one_line_errors,
    resolve_dsn,
)
from shardworker.core import logs
from shardworker.core.limits import DEFAULT_MAX_ATTEMPTS, MAX_DELAY_S

log = logging.getLogger("shardworker")


def _store(dsn: str) -> Any:
    from shardworker.store.pg_store import PgStore, StoreConfig

    return PgStore(StoreConfig(dsn=dsn))


def _ids(value: str | None) -> tuple[int, ...]:
    """--after's comma-separated job ids."""
    if not value:
        return ()
    try:
        ids = tuple(int(part) for part in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated job ids, got {value!r}", param_hint="--after") from None
    if not ids or min(ids) < 1 or max(ids) > 2**63 - 1:
        raise click.BadParameter(f"expected comma-separated job ids, got {value!r}", param_hint="--after")
    return ids


def _finite(value: float, name: str) -> float:
    if value != value or value in (float("inf"), float("-inf")):
        raise click.BadParameter(f"{value} is not a number of seconds", param_hint=name)
    return value


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log debug messages.")
@click.version_option(package_name="shardworker")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """shardworker: a PostgreSQL job worker that never re-runs a finished job because the
    database was away."""
    ctx.obj = {"level": logging.DEBUG if verbose else logging.INFO}
    logs.configure(logs.LogSetup(level=ctx.obj["level"]), "cli")


@main.command()
@click.option("--print", "print_sql", is_flag=True,
              help="Print the SQL instead of applying it (for Alembic, Django or psql); needs no database.")
@click.option("--after", type=click.IntRange(min=0), default=0, show_default=True,
              help="With --print: only migrations after this version.")
@click.option("--no-transaction", "bare", is_flag=True,
              help="With --print: no BEGIN/COMMIT around each migration, for tools that run a migration in a "
                   "transaction of their own (Alembic, Django's RunSQL).")
@dsn_option
@one_line_errors
def migrate(print_sql: bool, after: int, bare: bool, dsn: str | None) -> None:
    """Apply migrations/*.sql in order (idempotent), or --print them."""
    from shardworker.store.migrate import apply_migrations, migration_script
    from shardworker.store.schema import latest_version

    if bare and not print_sql:
        raise click.UsageError("--no-transaction goes with --print (shardworker migrate applies each migration in "
                               "a transaction of its own)")
    if print_sql:
        latest = latest_version()
        if after > latest:
            raise click.BadParameter(f"there is no version {after}: the latest migration is {latest}",
                                     param_hint="--after")
        if after == latest:
            note(f"no migrations after version {after}, the latest")
        click.echo(migration_script(after, transactions=not bare), nl=False)
        return
    applied = apply_migrations(resolve_dsn(dsn, migrate=False))
    click.echo(f"applied {len(applied)} migration(s)" + (f": {', '.join(applied)}" if applied else ""))


@main.command()
@click.argument("kind", type=UTF8, required=False)
@click.argument("payload_json", required=False)
@click.option("--count", type=click.IntRange(min=1), default=1, show_default=True, help="Enqueue N copies.")
@click.option("--file", "file_", type=click.File("rb"), default=None,
              help="Bulk JSONL file (or -): one object a line with kind, payload and optional fields; "
                   "--queue, --priority, --max-attempts, --delay and --key fill fields a line leaves out.")
@click.option("--queue", type=UTF8, default="default", show_default=True, help="Queue name.")
@click.option("--priority", type=int, default=0, show_default=True, help="Smaller runs first.")
@click.option("--max-attempts", type=click.IntRange(min=1), default=DEFAULT_MAX_ATTEMPTS, show_default=True, help="Attempts allowed.")
@click.option("--delay", type=click.FloatRange(min=0, max=MAX_DELAY_S), default=0.0, show_default=True,
              callback=lambda _ctx, _param, value: _finite(value, "--delay"), help="Seconds before the job may run.")
@click.option("--dedupe-key", type=UTF8, default=None, help="Skip when a live job holds this key.")
@click.option("--key", type=UTF8, default=None,
              help="Whose job it is (a tenant): claims take a queue's keys in turn, key_concurrency caps each.")
@click.option("--dedupe-window", type=Duration(), default=None,
              help="With --dedupe-key: also skip when a job with the key was enqueued or ended within this "
                   "(1h, 10m), done and failed ones too.")
@click.option("--debounce", type=Duration(), default=None,
              help="With --dedupe-key: run this long after the last enqueue; a job with the key still queued "
                   "takes this payload and is pushed back instead (its id printed).")
@click.option("--tag", "tags", type=UTF8, multiple=True,
              help="A label to find the job by (repeat for more): jobs list --tag, jobs retry|cancel|delete --tag.")
@click.option("--after", default=None, callback=lambda _ctx, _param, value: _ids(value),
              help="Comma-separated job ids: the job waits until they are all done.")
@click.option("--strict", is_flag=True,
              help="Refuse (exit 1, nothing enqueued) a kind no live worker has a handler for in its queue.")
@json_option
@dsn_option
@one_line_errors
def enqueue(kind: str | None, payload_json: str | None, count: int, file_: Any, queue: str, priority: int,
            max_attempts: int, delay: float, dedupe_key: str | None, key: str | None, dedupe_window: float | None,
            debounce: float | None, tags: tuple[str, ...], after: tuple[int, ...], strict: bool, as_json: bool,
            dsn: str | None) -> None:
    """Enqueue KIND with PAYLOAD_JSON, or a bulk --file; prints how many jobs it enqueued and
    their ids (--json: {"enqueued": N, "ids": [...]})."""
    from datetime import UTC, datetime, timedelta

    from shardworker.client import JobSpec, enqueue_many, loads_json, parse_jsonl
    from shardworker.client import enqueue as enqueue_one
    from shardworker.errors import EnqueueError

    if file_ is not None:
        if kind or payload_json:
            raise click.UsageError("give KIND/PAYLOAD_JSON or --file, not both")
        if dedupe_key is not None or dedupe_window is not None or debounce is not None:
            raise click.UsageError("--dedupe-key, --dedupe-window and --debounce apply to one job; put dedupe_key, "
                                   "dedupe_window and debounce in the file's lines")
        defaults: dict[str, Any] = {"queue": queue, "priority": priority, "max_attempts": max_attempts,
                                    **({"after": list(after)} if after else {}), **({"key": key} if key else {}),
                                    **({"tags": list(tags)} if tags else {})}
        if delay:
            defaults["run_at"] = (datetime.now(UTC) + timedelta(seconds=delay)).isoformat()
        specs = parse_jsonl(file_, defaults)
    else:
        if not kind:
            raise click.UsageError("KIND is required (or --file)")
        try:
            payload = loads_json(payload_json) if payload_json is not None else None
        except orjson.JSONDecodeError as exc:
            raise EnqueueError(f"PAYLOAD_JSON is not valid JSON: {exc}") from exc
        run_at = datetime.now(UTC) + timedelta(seconds=delay) if delay else None
        if count > 1 and dedupe_key:
            raise click.UsageError("--dedupe-key with --count > 1 would enqueue one job")
        specs = [JobSpec(kind, payload, queue, priority, max_attempts, run_at, dedupe_key, after, key,
                         dedupe_window, debounce, tags)] * count
    dsn = resolve_dsn(dsn)
    if len(specs) == 1 and file_ is None:
        spec = specs[0]
        job_id = enqueue_one(dsn, spec.kind, spec.payload, queue=spec.queue, priority=spec.priority,
                             max_attempts=spec.max_attempts, run_at=spec.run_at, dedupe_key=spec.dedupe_key,
                             after=spec.after, strict=strict, key=spec.key, dedupe_window=spec.dedupe_window,
                             debounce=spec.debounce, tags=spec.tags)
        ids = [job_id]
    else:
        ids = enqueue_many(dsn, specs, strict=strict)
    made = [i for i in ids if i is not None]
    click.echo(orjson.dumps({"enqueued": len(made), "ids": made}).decode() if as_json
               else _enqueued_line(made, len(ids) - len(made), dedupe_key, dedupe_window, debounce))


def _enqueued_line(made: list[int], skipped: int, dedupe_key: str | None, dedupe_window: float | None = None,
                   debounce: float | None = None) -> str:
    """What ``enqueue`` prints: how many jobs it made, their ids (the first and the last past
    ten), and how many a live dedupe key skipped."""
    if not made and dedupe_key is not None and debounce is not None:
        return (f"enqueued 0 jobs: the job holding dedupe key {dedupe_key!r} has started (or waits on others), "
                "so it is not debounced")
    if not made and dedupe_key is not None and dedupe_window is not None:
        return (f"enqueued 0 jobs: a job with dedupe key {dedupe_key!r} is live, or was enqueued or ended within "
                f"the last {dedupe_window:g}s")
    if not made and dedupe_key is not None:
        return f"enqueued 0 jobs: a live job holds dedupe key {dedupe_key!r}"
    if made and debounce is not None:
        return (f"debounced: job {made[0]} runs {debounce:g}s after the last enqueue with its key (a new job, or the "
                "one still queued with this payload)")
    line = f"enqueued {len(made)} job{'' if len(made) == 1 else 's'}"
    if len(made) > 10:
        line += f": ids {made[0]} to {made[-1]} (--json lists each)"
    elif made:
        line += ": " + ", ".join(map(str, made))
    if skipped:
        line += (" (1 skipped: a live job holds its dedupe key)" if skipped == 1
                 else f" ({skipped} skipped: live jobs hold their dedupe keys)")
    return line


@main.command()
@click.option("--exact", is_flag=True, help="Count every row, however big the table.")
@click.option("--by", "by", type=click.Choice(["queue", "key"]), default="queue", show_default=True,
              help="key: the keys (tenants) with the most unfinished jobs instead, most first.")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True, help="With --by key: how many keys.")
@json_option
@dsn_option
@one_line_errors
def stats(exact: bool, by: str, limit: int, as_json: bool, dsn: str | None) -> None:
    """Job counts, in total and by queue: waiting (on other jobs, a sleep or an event), available (queued, due),
    scheduled (queued for later), prefetched (claimed, not started), running (started), done,
    failed, cancelled. Above a million rows, done is estimated (~). --by key: the top keys by
    backlog (available, scheduled, claimed, the oldest available job's wait)."""
    from shardworker.core import counts

    if by == "key":
        _stats_by_key(resolve_dsn(dsn, start=False), limit, as_json)
        return
    store = _store(resolve_dsn(dsn, start=False))
    try:
        store.check_schema()
        rows, estimated = store.job_counts(exact_up_to=2**62 if exact else 1_000_000)
        queues = counts.split_by_queue(rows, store.backlog())
        limits = store.limits()
    finally:
        store.close()
    totals = counts.totals(queues)
    if as_json:
        click.echo(orjson.dumps({"total": _stats_json(totals),
                                 "queues": {q: _stats_json(c) for q, c in queues.items()},
                                 "estimated": ["done"] if estimated else [],
                                 "limits": [{**use._asdict(), "full": use.full} for use in limits]}).decode())
        return

    def show(name: str, n: int) -> str:
        return f"{name}={'~' if estimated and name == 'done' else ''}{n}"

    click.echo("  ".join(show(name, n) for name, n in totals.items() if n or name != "waiting"))
    for queue, by_name in queues.items():
        click.echo(f"  {queue}: " + "  ".join(show(name, n) for name, n in by_name.items() if n))
    for use in limits:
        click.echo(f"  limit {use.text()}{'  FULL' if use.full else ''}")
    if estimated:
        click.echo("(~ estimated from the planner's statistics; --exact counts every row)", err=True)


def _stats_by_key(dsn: str, limit: int, as_json: bool) -> None:
    from shardworker.core import counts
    from shardworker.store.queue_queries import key_backlog

    store = _store(dsn)
    try:
        store.check_schema()  # a database without keys' migration says to migrate, in one line
    finally:
        store.close()
    rows = key_backlog(dsn, limit)
    if as_json:
        click.echo(orjson.dumps([row._asdict() for row in rows]).decode())
        return
    if not rows:
        click.echo("no unfinished jobs with a key")
        return
    width = max(len("key"), *(len(row.key) for row in rows))
    click.echo(f"{'key':<{width}}  {'available':>9}  {'scheduled':>9}  {'claimed':>7}  oldest")
    for row in rows:
        age = "-" if row.oldest_available_s is None else counts.age_text(row.oldest_available_s)
        click.echo(f"{row.key:<{width}}  {row.available:>9}  {row.scheduled:>9}  {row.claimed:>7}  {age}")


def _stats_json(split: dict[str, int]) -> dict[str, int]:
    """The JSON of one row of ``stats``: the status column's counts as before (``queued``,
    ``running`` as claimed), then the split, with the handler-started jobs as ``started``."""
    return {"waiting": split["waiting"], "queued": split["available"] + split["scheduled"],
            "running": split["prefetched"] + split["running"],
            **{name: split[name] for name in ("done", "failed", "cancelled", "available", "scheduled", "prefetched")},
            "started": split["running"]}


from shardworker.cli.dashboard import dashboard  # noqa: E402
from shardworker.cli.demo import demo  # noqa: E402
from shardworker.cli.doctor import doctor  # noqa: E402
from shardworker.cli.events import events  # noqa: E402
from shardworker.cli.jobs import jobs  # noqa: E402
from shardworker.cli.ops import embedded, periodic, prune, workers  # noqa: E402
from shardworker.cli.outbox import outbox  # noqa: E402  (registers the outbox group)
from shardworker.cli.queues import queues  # noqa: E402
from shardworker.cli.run import run  # noqa: E402

main.add_command(run)
main.add_command(outbox)
main.add_command(demo)
main.add_command(jobs)
main.add_command(events)
main.add_command(queues)
main.add_command(prune)
main.add_command(workers)
main.add_command(periodic)
main.add_command(doctor)
main.add_command(dashboard)
main.add_command(embedded)
