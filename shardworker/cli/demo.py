"""``shardworker demo``: enqueue sample jobs and run them, on the embedded database by default."""

from __future__ import annotations

import sys
import time

import click

from shardworker.cli.common import dsn_option, one_line_errors, resolve_dsn


@click.command()
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="Sample jobs to enqueue [default: 5000; "
              "2000 with --outage; 600 with --steps].")
@click.option("--procs", type=click.IntRange(min=1, max=64), default=None,
              help="Child processes [default: 4; 2 with --outage or --steps].")
@click.option("--outbox-dir", default=".shardworker/demo-outbox", show_default=True, help="Outbox directory.")
@click.option("--outage", is_flag=True, help="Stop PostgreSQL mid-run, show the outbox fill and drain, and count "
              "re-runs (on an embedded server of the demo's own).")
@click.option("--steps", is_flag=True, help="Run jobs of four steps; stop PostgreSQL mid-run, kill -9 the worker "
              "between steps, restart it during the outage, and count steps re-run (on an embedded server of the "
              "demo's own).")
@click.option("--outage-seconds", type=click.FloatRange(min=0.5, max=600), default=5.0, show_default=True,
              help="With --outage or --steps: how long PostgreSQL stays down.")
@dsn_option
@one_line_errors
def demo(jobs: int | None, procs: int | None, outbox_dir: str, outage: bool, steps: bool, outage_seconds: float,
         dsn: str | None) -> None:
    """Enqueue sample jobs, run them with N processes until idle, and print a summary;
    with --outage, live through a database outage and count the re-runs (0); with --steps,
    kill the worker between durable steps during an outage and count the steps re-run (0)."""
    if outage and steps:
        raise click.UsageError("--outage and --steps are two demos: choose one")
    if outage or steps:
        refuse_a_dsn("steps" if steps else "outage", dsn)
        (steps_demo if steps else outage_demo)(jobs, procs, outage_seconds)
        return
    jobs, procs = jobs or 5000, procs or 4
    from shardworker.client import JobSpec, enqueue_many
    from shardworker.core.config import WorkerConfig
    from shardworker.demo.app import app
    from shardworker.store.pg_store import PgStore, StoreConfig
    from shardworker.worker.supervisor import Supervisor

    embedded, dsn = dsn is None, resolve_dsn(dsn)
    specs = [JobSpec("demo.flaky" if i % 100 == 0 else "demo.hash", {"n": i}, queue="demo") for i in range(jobs)]
    click.echo(f"enqueued {len(enqueue_many(dsn, specs))} jobs; running them with --procs {procs}", err=True)
    config = WorkerConfig(dsn=dsn, app_ref="shardworker.demo.app:app", procs=procs, outbox_dir=outbox_dir,
                          queues=("demo",), exit_when_idle=True, embedded_db=embedded,
                          # A progress line a second on a terminal; quiet elsewhere.
                          log_interval_s=1.0 if sys.stderr.isatty() else 3600.0)
    started = time.monotonic()
    summary = Supervisor(config, app).run()
    elapsed = time.monotonic() - started
    store = PgStore(StoreConfig(dsn=dsn))
    try:
        counts = {status: n for queue, status, n in store.stats() if queue == "demo"}
    finally:
        store.close()
    retried = max(0, summary.done - counts.get("done", 0) - counts.get("failed", 0))
    click.echo(f"demo: {summary.done} outcomes in {elapsed:.1f}s ({summary.done / max(elapsed, 1e-9):.0f} jobs/s); "
               f"done={counts.get('done', 0)} failed={counts.get('failed', 0)} queued={counts.get('queued', 0)} "
               f"running={counts.get('running', 0)}; {retried} planned flaky failures retried; "
               f"outbox pending={summary.pending_outcomes}")



def refuse_a_dsn(name: str, dsn: str | None) -> None:
    """``demo --outage`` and ``demo --steps`` stop PostgreSQL, so they run only on an embedded
    server of their own: a --dsn is a usage error (SHARDWORKER_DSN is not used)."""
    source = click.get_current_context().get_parameter_source("dsn")
    if dsn and source == click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError(f"demo --{name} stops PostgreSQL, so it runs only on an embedded server of its "
                               "own: drop --dsn (and SHARDWORKER_DSN)")


def outage_demo(jobs: int | None, procs: int | None, outage_seconds: float) -> None:
    from shardworker.demo import outage

    result = outage.run(jobs or 2000, procs or 2, outage_seconds)
    click.echo(result.table())
    if result.rerun_jobs or result.statuses.get("done", 0) != result.jobs:
        raise outage.DemoFailed(f"the promise did not hold: {result.rerun_jobs} jobs ran again")


def steps_demo(jobs: int | None, procs: int | None, outage_seconds: float) -> None:
    from shardworker.demo import steps
    from shardworker.demo.harness import DemoFailed

    result = steps.run(jobs or 600, procs or 2, outage_seconds)
    click.echo(result.table())
    done = result.statuses.get("done", 0)
    if result.steps_rerun or done != result.jobs:
        raise DemoFailed(f"the promise did not hold: {result.steps_rerun} steps ran again after they had returned; "
                         f"{done} of {result.jobs} jobs done")
