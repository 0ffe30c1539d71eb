"""``shardworker run``: the worker, from the command line. Every option's default is read
from ``WorkerConfig`` (``shardworker.core.config``), so the command and the library agree."""

from __future__ import annotations

import logging
import time
from typing import Any

import click

from shardworker.cli.common import (
    MAX_NETWORK_TIMEOUT_S,
    MAX_PG_TIMEOUT_S,
    UTF8,
    Duration,
    Seconds,
    dsn_option,
    is_loopback,
    note,
    one_line_errors,
    outbox_dir_option,
    resolve_dsn,
)
from shardworker.core import logs
from shardworker.core.config import FAILED_RETENTION_S, WorkerConfig, duration_text
from shardworker.core.limits import MiB

D = WorkerConfig.default


@click.command()
@click.option("--app", "app_ref", required=True, help="MODULE[:ATTR] holding the App (ATTR defaults to app).")
@click.option("--procs", type=click.IntRange(min=1, max=512), default=D("procs"), show_default=True,
              help="Child processes running handlers.")
@outbox_dir_option
@click.option("--queues", type=UTF8, default=None, help="Comma-separated queues to claim from (default: all).",
              callback=lambda _ctx, _param, value: value if value is None else ",".join(queue_names(value)))
@click.option("--worker-id", default=None, help="Worker id (default: stored in the outbox directory).")
@click.option("--exit-when-idle", is_flag=True,
              help="Exit 0 once nothing is due or running and the outbox is empty; retries due within "
                   "--shutdown-timeout are waited for.")
@click.option("--shutdown-timeout", type=Seconds(0), default=D("shutdown_timeout_s"), show_default=True,
              help="Seconds to finish jobs in hand at shutdown.")
@click.option("--default-timeout", envvar="SHARDWORKER_DEFAULT_TIMEOUT", type=Duration(),
              default=duration_text(D("default_timeout_s")), show_default=True,
              help="Timeout of every handler without its own timeout_s (90s, 30m, 2h; 0: none); a handler past "
                   "it fails that attempt (env SHARDWORKER_DEFAULT_TIMEOUT).")
@click.option("--cancel-grace", type=Seconds(0), default=D("cancel_grace_s"), show_default=True,
              help="Seconds a running job cancelled by an operator (jobs cancel) may take to stop before "
                   "its child is stopped, as for a timeout.")
@click.option("--rescue-after", type=Seconds(1), default=D("rescue_after_s"), show_default=True,
              help="Seconds of watched heartbeat silence before a peer rescues a worker's jobs "
                   "(must exceed --shutdown-timeout).")
@click.option("--release-slots-after", type=Seconds(1), default=D("release_slots_after_s"), show_default=True,
              help="Seconds of watched heartbeat silence after which a worker's running jobs stop counting "
                   "toward limits across workers (global_concurrency, a queue's concurrency); the jobs stay "
                   "its own until --rescue-after.")
@click.option("--rescue-grace", type=Seconds(0), default=D("rescue_grace_s"), show_default=True,
              help="Seconds a rescued job waits before it may run again; a late outcome of the rescued "
                   "attempt lands meanwhile instead.")
@click.option("--backoff-cap", type=Seconds(0.01), default=D("backoff_cap_s"), show_default=True,
              help="Maximum seconds between database retries.")
@click.option("--network-timeout", type=click.IntRange(min=2, max=MAX_NETWORK_TIMEOUT_S),
              default=D("network_timeout_s"), show_default=True,
              help="Seconds before an unresponsive database connection is declared dead.")
@click.option("--statement-timeout", type=Seconds(0.1, MAX_PG_TIMEOUT_S), default=D("statement_timeout_s"),
              show_default=True, help="Seconds a database statement may run.")
@click.option("--min-free-mb", type=click.IntRange(min=0), default=D("min_free_bytes") // MiB, show_default=True,
              help="Stop claiming when the outbox disk has less free space than this.")
@click.option("--concurrency", envvar="SHARDWORKER_CONCURRENCY", type=click.IntRange(min=1, max=10_000),
              default=D("concurrency"), show_default=True,
              help="Handlers in flight per child for async def and threads=True kinds "
                   "(env SHARDWORKER_CONCURRENCY); plain sync handlers run one at a time per child.")
@click.option("--prefetch", type=click.IntRange(min=1, max=100_000), default=D("prefetch_batch"), show_default=True,
              help="Jobs a child holds beyond those it runs at once (async and threads=True "
                   "handlers: at least twice --concurrency).")
@click.option("--retention", type=Duration(), default=duration_text(D("retention_s")), show_default=True,
              help="Prune done jobs older than this (30m, 12h, 7d); 0 keeps them all (and, unless "
                   "--retention-failed is given, failed and cancelled ones too).")
@click.option("--retention-failed", type=Duration(), default=None,
              show_default=f"{duration_text(FAILED_RETENTION_S)}, or --retention when longer",
              help="Prune failed and cancelled jobs older than this; 0 keeps them all.")
@click.option("--event-retention", type=Duration(), default=duration_text(D("event_retention_s")), show_default=True,
              help="Keep sent events this long (1h, 7d), whether or not a job waited on them: a job.wait_event "
                   "that starts after its event was sent still takes it.")
@click.option("--segment-bytes", type=click.IntRange(min=4096), default=D("segment_bytes"), show_default=True,
              help="Outbox segment size: a segment is deleted once every outcome in it is applied, and the "
                   "reapply window has passed.")
@click.option("--reapply-window", type=Duration(), default=duration_text(D("reapply_window_s")), show_default=True,
              help="Keep applied outcomes this long after they land (5m, 1h; 0: no sealed segment is kept), so "
                   "that a database that comes back older (a failover to a replica that lagged, a restore) gets "
                   "them again instead of their jobs running again.")
@click.option("--reapply-max-mb", type=click.IntRange(min=0, max=1 << 20), default=D("reapply_max_bytes") // MiB,
              show_default=True, help="At most this many MiB of applied outcomes kept (the oldest go first; all "
                                      "of them before the disk reaches --min-free-mb).")
@click.option("--metrics-port", envvar="SHARDWORKER_METRICS_PORT", type=click.IntRange(min=0, max=65535),
              default=None, help="Serve Prometheus text at /metrics on this port (env SHARDWORKER_METRICS_PORT).")
@click.option("--metrics-host", envvar="SHARDWORKER_METRICS_HOST", default=D("metrics_host"), show_default=True,
              help="Address the metrics server binds; beyond loopback it needs --metrics-token.")
@click.option("--metrics-token", envvar="SHARDWORKER_METRICS_TOKEN", default=None,
              help="Bearer token scrapes must send (env SHARDWORKER_METRICS_TOKEN).")
@click.option("--log-format", envvar="SHARDWORKER_LOG_FORMAT", type=click.Choice(logs.FORMATS), default="text",
              show_default=True,
              help="text for people, json for machines: one object a line (env SHARDWORKER_LOG_FORMAT).")
@click.option("--listen-dsn", envvar="SHARDWORKER_LISTEN_DSN", default=None,
              help="A direct PostgreSQL DSN (not through a transaction pool such as PgBouncer) used for "
                   "LISTEN only, so enqueues wake the worker at once (env SHARDWORKER_LISTEN_DSN).")
@dsn_option
@one_line_errors
@click.pass_context
def run(ctx: click.Context, app_ref: str, log_format: str, dsn: str | None, **options: Any) -> None:
    """Run the worker: a parent, N children and one flusher."""
    from shardworker.core import procs

    with procs.stop_signals_held():  # a SIGTERM while the app imports stops the worker cleanly, as later
        from shardworker.app import load_app
        from shardworker.worker.supervisor import Supervisor

        refuse_bad_combinations(**options)
        app_logger = app_ref.split(":", 1)[0].split(".", 1)[0]  # the app's own lines, at the worker's level
        logs.configure(logs.LogSetup(log_format, (ctx.obj or {}).get("level", logging.INFO),
                                     loggers=("shardworker", app_logger)), "parent")
        app = load_app(app_ref)
        config = worker_config(app_ref, dsn or app.dsn, **options)  # (the app's own: the Django backend's)
        started = time.monotonic()
        summary = Supervisor(config, app).run()
        elapsed = time.monotonic() - started
    kinds = ", ".join(f"{n} {name}" for name, n in summary.outcomes.items() if n)
    note(f"worker stopped after {elapsed:.1f}s: {summary.done} outcomes" + (f" ({kinds})" if kinds else "")
         + f", {summary.released} jobs given back, {summary.pending_outcomes} outcomes pending in the outbox",
         outcomes=summary.done, **summary.outcomes, released=summary.released,
         pending_outcomes=summary.pending_outcomes, seconds=round(elapsed, 3))


def refuse_bad_combinations(*, rescue_after: float, shutdown_timeout: float, metrics_port: int | None,
                            metrics_host: str, metrics_token: str | None, **_: Any) -> None:
    """Usage errors between options, before anything starts."""
    if rescue_after <= shutdown_timeout:
        raise click.BadParameter(f"{rescue_after:g}s must be longer than --shutdown-timeout ({shutdown_timeout:g}s): "
                                 "a stopping worker must never look dead to its peers", param_hint="--rescue-after")
    if metrics_port is not None and not metrics_token and not is_loopback(metrics_host):
        raise click.BadParameter(f"{metrics_host} is reachable from other hosts: give --metrics-token "
                                 "(or SHARDWORKER_METRICS_TOKEN) too, or bind 127.0.0.1", param_hint="--metrics-host")


def queue_names(value: str) -> tuple[str, ...]:
    """--queues a,b: the names, none of them empty (an unset variable must not mean every queue)."""
    names = tuple(name.strip() for name in value.split(","))
    if not all(names):
        raise click.BadParameter(f"{value!r} has an empty queue name (leave --queues out to claim from every "
                                 "queue)", param_hint="--queues")
    return names


def worker_config(app_ref: str, dsn: str | None, *, procs: int, outbox_dir: str, queues: str | None,
                  worker_id: str | None, exit_when_idle: bool, shutdown_timeout: float, default_timeout: float,
                  cancel_grace: float,
                  rescue_after: float, release_slots_after: float, rescue_grace: float, backoff_cap: float,
                  network_timeout: int,
                  statement_timeout: float, min_free_mb: int, concurrency: int, prefetch: int, retention: float,
                  retention_failed: float | None, event_retention: float, segment_bytes: int, metrics_port: int | None, metrics_host: str,
                  metrics_token: str | None, listen_dsn: str | None, reapply_window: float,
                  reapply_max_mb: int) -> WorkerConfig:
    """The ``WorkerConfig`` of the command's options (``WorkerConfig`` checks each value)."""
    return WorkerConfig(
        dsn=resolve_dsn(dsn), embedded_db=dsn is None, app_ref=app_ref, procs=procs, outbox_dir=outbox_dir,
        queues=None if queues is None else queue_names(queues), worker_id=worker_id,
        exit_when_idle=exit_when_idle, shutdown_timeout_s=shutdown_timeout, default_timeout_s=default_timeout,
        cancel_grace_s=cancel_grace, rescue_after_s=rescue_after, release_slots_after_s=release_slots_after,
        rescue_grace_s=rescue_grace,
        backoff_cap_s=backoff_cap, backoff_base_s=min(D("backoff_base_s"), backoff_cap),
        min_free_bytes=min_free_mb * MiB, network_timeout_s=network_timeout, statement_timeout_s=statement_timeout,
        connect_timeout_s=min(D("connect_timeout_s"), network_timeout), concurrency=concurrency,
        prefetch_batch=prefetch, segment_bytes=segment_bytes, retention_s=retention,
        retention_failed_s=retention_failed, event_retention_s=event_retention, metrics_port=metrics_port,
        metrics_host=metrics_host, metrics_token=metrics_token or None, listen_dsn=listen_dsn or None,
        reapply_window_s=reapply_window, reapply_max_bytes=reapply_max_mb * MiB)
