"""``shardworker demo``: enqueue sample jobs and run them, on the embedded database by default."""

from __future__ import annotations

import time

import click

from shardworker.cli_common import dsn_option, one_line_errors, resolve_dsn


@click.command()
@click.option("--jobs", type=click.IntRange(min=1), default=5000, show_default=True, help="Sample jobs to enqueue.")
@click.option("--procs", type=click.IntRange(min=1, max=64), default=4, show_default=True, help="Child processes.")
@click.option("--outbox-dir", default=".shardworker/demo-outbox", show_default=True, help="Outbox directory.")
@dsn_option
@one_line_errors
def demo(jobs: int, procs: int, outbox_dir: str, dsn: str | None) -> None:
    """Enqueue sample jobs, run them with N processes until idle, and print a summary."""
    from shardworker.client import JobSpec, enqueue_many
    from shardworker.config import WorkerConfig
    from shardworker.demo_app import app
    from shardworker.pg_store import PgStore, StoreConfig
    from shardworker.supervisor import Supervisor

    embedded, dsn = dsn is None, resolve_dsn(dsn)
    specs = [JobSpec("demo.flaky" if i % 10 == 0 else "demo.hash", {"n": i}, queue="demo") for i in range(jobs)]
    click.echo(f"enqueued {enqueue_many(dsn, specs)} jobs; running them with --procs {procs}", err=True)
    config = WorkerConfig(dsn=dsn, app_ref="shardworker.demo_app:app", procs=procs, outbox_dir=outbox_dir,
                          queues=("demo",), exit_when_idle=True, log_interval_s=1.0, embedded_db=embedded)
    started = time.monotonic()
    summary = Supervisor(config, app).run()
    elapsed = time.monotonic() - started
    store = PgStore(StoreConfig(dsn))
    try:
        counts = {status: n for queue, status, n in store.stats() if queue == "demo"}
    finally:
        store.close()
    click.echo(f"demo: {summary.done} outcomes in {elapsed:.1f}s ({summary.done / max(elapsed, 1e-9):.0f} jobs/s); "
               f"done={counts.get('done', 0)} failed={counts.get('failed', 0)} queued={counts.get('queued', 0)} "
               f"running={counts.get('running', 0)}; outbox pending={summary.pending_outcomes}")
