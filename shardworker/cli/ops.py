"""``shardworker prune``, ``workers``, ``periodic`` and ``embedded``: keeping the table
small, seeing who works on it, and the embedded server."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import orjson

from shardworker.cli.common import (
    EMBEDDED_BASE,
    Duration,
    dsn_option,
    json_option,
    note,
    one_line_errors,
    resolve_dsn,
    schema_hint,
)
from shardworker.core.config import WorkerConfig
from shardworker.core.limits import SILENT_AFTER_S
from shardworker.core.views import in_utc, json_value

RESCUE_GRACE_S = WorkerConfig.rescue_grace_s


def _store(dsn: str) -> Any:
    from shardworker.store.pg_store import PgStore, StoreConfig

    store = PgStore(StoreConfig(dsn=dsn))
    store.check_schema()
    return store


@click.command()
@click.option("--older-than", "older_than", type=Duration(), required=True,
              help="Delete done, failed and cancelled jobs that ended longer ago than this (30m, 12h, 7d).")
@click.option("--status", "statuses", type=click.Choice(("done", "failed", "cancelled")), multiple=True,
              help="Only jobs that ended so (repeat it for several); default: all three.")
@click.option("--batch", type=click.IntRange(min=1, max=100_000), default=1000, show_default=True,
              help="Rows deleted per transaction.")
@json_option
@dsn_option
@one_line_errors
def prune(older_than: float, statuses: tuple[str, ...], batch: int, as_json: bool, dsn: str | None) -> None:
    """Delete finished jobs older than a duration, in small batches (workers do this by
    --retention for done jobs and --retention-failed for failed and cancelled ones)."""
    from shardworker.worker.housekeeping import FINISHED
    from shardworker.worker.housekeeping import prune as prune_jobs

    if older_than <= 0:
        # In --retention, 0 keeps everything; here it would delete everything: say which is meant.
        raise click.BadParameter("0 would delete every finished job (while --retention 0 keeps them all); "
                                 "give a duration such as 1s to mean every job finished a second ago or more",
                                 param_hint="--older-than")

    tty = sys.stderr.isatty()

    def progress(total: int) -> None:
        if tty:
            click.echo(f"\rpruned {total} jobs…", nl=False, err=True)

    store = _store(resolve_dsn(dsn))
    try:
        total = prune_jobs(store, older_than, statuses=statuses or FINISHED, batch=batch, on_batch=progress)
    finally:
        store.close()
    if tty:
        click.echo("\r\033[K", nl=False, err=True)
    click.echo(orjson.dumps({"pruned": total}).decode() if as_json else f"pruned {total} jobs")


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def _slots(row: Any) -> str:
    """The slots a worker's running jobs hold, as `kind send_email 2, queue mail 1`."""
    held = ", ".join(f"{slot.replace(':', ' ', 1)} {n}" for slot, n in sorted(row.slots.items()))
    return held + (" (released)" if held and row.slots_released else "")


@click.group(invoke_without_command=True)
@click.option("--all", "show_all", is_flag=True, help="Also workers silent for longer than --silent-after.")
@click.option("--silent-after", type=Duration(), default=f"{SILENT_AFTER_S:.0f}s", show_default=True,
              help="A worker whose last heartbeat is older than this is not live.")
@json_option
@dsn_option
@one_line_errors
@click.pass_context
def workers(ctx: click.Context, show_all: bool, silent_after: float, as_json: bool, dsn: str | None) -> None:
    """Live workers: host, pid, started, last heartbeat, jobs running, outcomes pending, and
    the slots of limits across workers their running jobs hold (released once a worker is
    silent past its --release-slots-after). `workers forget ID` gives a dead worker's jobs back."""
    if ctx.invoked_subcommand is not None:
        return
    dsn = resolve_dsn(dsn, start=False)
    store = _store(dsn)
    try:
        rows = store.workers()
    finally:
        store.close()
    live = {r.worker_id: r.silent_s <= silent_after for r in rows}
    shown = [r for r in rows if show_all or live[r.worker_id]]
    if as_json:
        click.echo(orjson.dumps([{**r.to_json(), "live": live[r.worker_id]} for r in shown]).decode())
        return
    if not shown:
        silent = len(rows) - len(shown)
        click.echo("no live workers" + (f" ({silent} silent: --all shows them)" if silent else "")
                   + schema_hint(dsn))
        return
    click.echo(f"{'worker':<28} {'host':<20} {'pid':>7}  {'started (UTC)':<19}  {'heartbeat':<10} {'running':>7} "
               f"{'pending':>8}  slots")
    for r in shown:
        running = "?" if r.jobs_running is None else r.jobs_running
        pending = "?" if r.outbox_pending is None else r.outbox_pending
        state = "" if live[r.worker_id] else "  SILENT"
        click.echo(f"{r.worker_id:<28} {r.hostname:<20} {r.pid:>7}  {in_utc(r.started_at):%Y-%m-%d %H:%M:%S}  "
                   f"{_ago(r.silent_s):<10} {running:>7} {pending:>8}  {_slots(r) or '-'}{state}")


@workers.command("forget")
@click.argument("worker_id")
@click.option("--silent-after", type=Duration(), default=f"{SILENT_AFTER_S:.0f}s", show_default=True,
              help="Refused unless the worker's last heartbeat is older than this.")
@click.option("--grace", type=Duration(), default=f"{RESCUE_GRACE_S:.0f}s", show_default=True,
              help="How long its jobs wait before they may run again (as run --rescue-grace): a late outcome "
                   "of the worker, if it was only cut off, lands meanwhile instead.")
@json_option
@dsn_option
@one_line_errors
def workers_forget(worker_id: str, silent_after: float, grace: float, as_json: bool, dsn: str | None) -> None:
    """Give a dead worker's jobs back now, as a peer's rescue would after --rescue-after: its
    running jobs are queued again (or failed, at their last attempt) to run after --grace,
    their slots free at once, and its row goes. Refused for a live worker."""
    store = _store(resolve_dsn(dsn, start=False))
    try:
        row = next((r for r in store.workers() if r.worker_id == worker_id), None)
        if row is None:
            raise click.ClickException(f"no worker {worker_id!r} (shardworker workers --all lists them)")
        if row.silent_s < silent_after:
            raise click.ClickException(
                f"worker {worker_id!r} beat {row.silent_s:.0f}s ago: it is live (refused until it is silent for "
                f"{silent_after:g}s; its slots are released after {row.slots_after_s or 0:g}s of silence)")
        rescued = store.rescue_workers([(worker_id, row.heartbeat_at)], grace)
    finally:
        store.close()
    if not rescued.workers:
        raise click.ClickException(f"worker {worker_id!r} beat again, or a peer rescued it first: nothing done")
    if as_json:
        click.echo(orjson.dumps({"worker_id": worker_id, "jobs": rescued.jobs}).decode())
        return
    n = len(rescued.jobs)
    click.echo(f"forgot worker {worker_id}: {n} job{'' if n == 1 else 's'} given back "
               f"(they may run again in {grace:g}s)")


@click.command()
@json_option
@dsn_option
@one_line_errors
def periodic(as_json: bool, dsn: str | None) -> None:
    """Periodic schedules workers checked in the last day, with the last tick each enqueued (a
    schedule removed from the code leaves the list, and the table, a day after its last check)."""
    from shardworker.core.config import WorkerConfig, duration_text

    within = WorkerConfig.periodic_forget_s
    store = _store(resolve_dsn(dsn, start=False))
    try:
        rows = store.periodic_state(within)
    finally:
        store.close()
    if as_json:
        click.echo(orjson.dumps([{"name": n, "schedule": s, "last_tick": t and json_value(t),
                                  "updated_at": json_value(u)} for n, s, t, u in rows]).decode())
        return
    if not rows:
        click.echo(f"no periodic schedules checked by a worker in the last {duration_text(within)}")
    for name, schedule, last_tick, _ in rows:
        click.echo(f"{name:<30} {schedule:<20} last tick {json_value(last_tick) if last_tick else '(none yet)'}")


EMBEDDED_DATA = Path(EMBEDDED_BASE) / "pgdata"


@click.group()
def embedded() -> None:
    """The embedded PostgreSQL under .shardworker/ that commands use without --dsn."""


@embedded.command("start")
@one_line_errors
def embedded_start() -> None:
    """Create it if needed, start it and bring its schema up to date (commands that only read,
    such as stats and doctor, never start it)."""
    from shardworker.embedded import EmbeddedPostgres, ensure_embedded
    from shardworker.store.migrate import apply_migrations

    apply_migrations(ensure_embedded(EMBEDDED_BASE))
    click.echo(f"embedded PostgreSQL in {EMBEDDED_DATA} running on 127.0.0.1:{EmbeddedPostgres(EMBEDDED_DATA).port}")


@embedded.command("dsn")
@one_line_errors
def embedded_dsn() -> None:
    """Print its DSN, password included (for SHARDWORKER_DSN, psql or an application); it
    stays the same across restarts. Starts nothing."""
    from shardworker.embedded import EmbeddedNotRunning, EmbeddedPostgres, running_embedded

    try:
        click.echo(running_embedded(EMBEDDED_BASE))
    except EmbeddedNotRunning as exc:
        if not (EMBEDDED_DATA / "PG_VERSION").exists():
            raise
        click.echo(EmbeddedPostgres(EMBEDDED_DATA).dsn)
        note(f"{exc.state}; `shardworker embedded start` starts it")


@embedded.command("status")
@json_option
def embedded_status(as_json: bool) -> None:
    """Whether it runs, on which port, and where its data is; exit 1 when it is not running."""
    from shardworker.embedded import EmbeddedPostgres

    datadir = EMBEDDED_DATA
    exists = (datadir / "PG_VERSION").exists()
    server = EmbeddedPostgres(datadir) if exists else None
    running = server is not None and server.is_running()
    info = {"data": str(datadir), "exists": exists, "running": running, "port": server.port if server else None}
    if as_json:
        click.echo(orjson.dumps(info).decode())
    elif not exists:
        click.echo(f"no embedded PostgreSQL in {datadir} (a command without --dsn creates one)")
    else:
        state = f"running on 127.0.0.1:{server.port}" if server and running else "stopped"
        click.echo(f"embedded PostgreSQL in {datadir}: {state}")
    if not running:
        sys.exit(1)


@embedded.command("stop")
@one_line_errors
def embedded_stop() -> None:
    """Stop it (a fast shutdown: connections are closed, nothing is lost); the next command
    without --dsn starts it again."""
    from shardworker.embedded import EmbeddedPostgres

    datadir = EMBEDDED_DATA
    if not (datadir / "PG_VERSION").exists():
        click.echo(f"no embedded PostgreSQL in {datadir}")
        return
    server = EmbeddedPostgres(datadir)
    if not server.is_running():
        click.echo(f"embedded PostgreSQL in {datadir} is not running")
        return
    server.stop("fast")
    click.echo(f"stopped the embedded PostgreSQL in {datadir}")
