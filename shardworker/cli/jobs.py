"""``shardworker jobs list|show|wait|update|wake|retry|cancel|delete``: operating on jobs without SQL.

Thin commands over ``shardworker.jobs``; each takes ``--json``. Bad input (an unknown id or
status, a job in the wrong state, a bad ``--since``) is one line on stderr and exit 1,
and a refused bulk change changes nothing.
"""

from __future__ import annotations

import sys
from datetime import datetime
from typing import Any

import click
import orjson

from shardworker import jobs as jobs_api
from shardworker.cli.common import (
    JOB_ID,
    UTF8,
    Duration,
    Seconds,
    dsn_option,
    json_option,
    one_line_errors,
    resolve_dsn,
    schema_hint,
)
from shardworker.core.views import in_utc


def _echo_jobs(found: list[jobs_api.JobInfo], as_json: bool, dsn: str | None = None) -> None:
    """The jobs as JSON, or a table under a header (times in UTC, as every command prints them)."""
    if as_json:
        click.echo(jobs_api.dumps_json([j.to_json() for j in found]))
        return
    if not found:
        click.echo("no jobs match" + (schema_hint(dsn) if dsn is not None else ""), err=True)
        return
    width = max(len("attempts"), *(len(j.attempts_text) for j in found))
    # A key column only when some job shown has a key (a tenant's): most queues have none.
    keys = max((len(j.key) for j in found if j.key is not None), default=0)
    key_head = f"  {'key':<{max(keys, 3)}}" if keys else ""
    # The last column says what a waiting job waits on and how far a job got, when some job shown does.
    noted = any(j.status == "waiting" or j.progress is not None for j in found)
    click.echo(f"{'id':>10}  {'status':<9}  {'kind':<20}  {'queue':<10}{key_head}  {'attempts':<{width}}  "
               f"{'created (UTC)':<19}  {'waits on, progress or last error' if noted else 'last error'}")
    for j in found:
        key = f"  {j.key or '-':<{max(keys, 3)}}" if keys else ""
        click.echo(f"{j.id:>10}  {j.status:<9}  {j.kind:<20}  {j.queue:<10}{key}  {j.attempts_text:<{width}}"
                   f"  {in_utc(j.created_at):%Y-%m-%d %H:%M:%S}  {_note(j)}".rstrip())


def _note(job: jobs_api.JobInfo) -> str:
    """The last column of a job's line: what a waiting job waits on (a sleep till when, an
    event's key, other jobs); why a failed or cancelled one ended; how far a job got
    (job.progress); else the last error of one that is not done (a done job's is an earlier
    attempt's: beside `done` it reads as a failure)."""
    error = (job.last_error or "").splitlines()[0][:60] if job.last_error and job.status != "done" else ""
    if job.status == "waiting":
        return job.waiting_on
    if error and job.status in ("failed", "cancelled"):
        return error
    return f"progress {jobs_api.dumps_json(job.progress)[:60]}" if job.progress is not None else error


def filter_options(fn: Any) -> Any:
    """The filters that pick jobs, for `jobs list` and the bulk `jobs retry|cancel|delete`."""
    for option in reversed([
            click.option("--status", type=click.Choice(jobs_api.STATUSES), multiple=True, help="Only these statuses."),
            click.option("--kind", type=UTF8, default=None, help="Only this kind."),
            click.option("--queue", type=UTF8, default=None, help="Only this queue."),
            click.option("--key", type=UTF8, default=None, help="Only jobs with this key (a tenant's)."),
            click.option("--tag", "tags", type=UTF8, multiple=True,
                         help="Only jobs with this tag (repeat: all of them)."),
            click.option("--since", default=None, help="Created since: 30m, 2h, 7d, or an ISO 8601 time."),
            click.option("--error-contains", default=None, type=UTF8,
                         help="Only jobs whose last error contains this text (any case).")]):
        fn = option(fn)
    return fn


def _filters(status: tuple[str, ...], kind: str | None, queue: str | None, key: str | None, tags: tuple[str, ...],
             since: str | None, error_contains: str | None) -> dict[str, Any]:
    if key is not None and not key.strip():
        raise click.BadParameter("an empty key names no job (jobs without a key have none)", param_hint="--key")
    return {"status": status or None, "kind": kind, "queue": queue, "key": key, "tag": list(tags) or None,
            "since": jobs_api.parse_since(since), "error_contains": error_contains or None}


def _bulk(action: str, ids: tuple[int, ...], filters: dict[str, Any], dry_run: bool, as_json: bool, dsn: str | None,
          **extra: Any) -> bool:
    """The bulk form of a change, when no ids are given and a filter is: True once it ran."""
    given = any(v is not None for v in filters.values())
    if ids and (given or dry_run):
        also = "--failed or " if action == "retry" else ""
        raise jobs_api.JobsError(f"{action}: give job ids, or {also}filters (with --dry-run), not both")
    if not given:
        if dry_run:
            raise jobs_api.JobsError(f"{action}: --dry-run goes with filters")
        return False
    count = getattr(jobs_api, f"{action}_matching")(resolve_dsn(dsn), **filters, dry_run=dry_run, **extra)
    from shardworker.store.job_queries import BULK_LIMIT

    if count >= BULK_LIMIT and not as_json:
        click.echo(f"at most {BULK_LIMIT:,} jobs a call: run it again for the rest", err=True)
    if dry_run:
        click.echo(orjson.dumps({action: count, "dry_run": True}).decode() if as_json
                   else f"would {action} {count} job{'' if count == 1 else 's'} (nothing changed: --dry-run)")
    else:
        _echo_changed(action, count, as_json, steps_reset=bool(extra.get("reset_steps")))
    return True


@click.group()
def jobs() -> None:
    """List, show, wait for, update, wake, retry, cancel and delete jobs."""


@jobs.command("list")
@filter_options
@click.option("--limit", type=JOB_ID, default=50, show_default=True)
@json_option
@dsn_option
@one_line_errors
def list_command(status: tuple[str, ...], kind: str | None, queue: str | None, key: str | None, tags: tuple[str, ...],
                 since: str | None, error_contains: str | None, limit: int, as_json: bool, dsn: str | None) -> None:
    """Jobs, newest first."""
    dsn = resolve_dsn(dsn, start=False)
    found = jobs_api.list_jobs(dsn, limit=limit, **_filters(status, kind, queue, key, tags, since, error_contains))
    _echo_jobs(found, as_json, dsn)


@jobs.command("show")
@click.argument("job_id", type=JOB_ID)
@json_option
@dsn_option
@one_line_errors
def show_command(job_id: int, as_json: bool, dsn: str | None) -> None:
    """One job: payload, result, last error, attempts, timings, worker, its last failed
    attempts (each with its error and traceback), its recorded steps (name, attempt, when,
    size; the first 50 unless --json), the jobs it waits on (after=) and the jobs waiting on it."""
    dsn = resolve_dsn(dsn, start=False)
    job = jobs_api.get_job(dsn, job_id)
    if job is None:
        raise jobs_api.JobsError(f"no job {job_id}{schema_hint(dsn)}")
    dependencies, dependents = jobs_api.get_links(dsn, job_id)
    errors = jobs_api.get_errors(dsn, job_id)
    if as_json:
        steps = jobs_api.get_steps(dsn, job_id)
        click.echo(jobs_api.dumps_json({**job.to_json(), "errors": [e.to_json() for e in errors],
                                        "steps": [s.to_json() for s in steps],
                                        "dependencies": [d.to_json() for d in dependencies],
                                        "dependents": [d.to_json() for d in dependents]}))
        return
    _echo_job(job, as_json)
    _echo_errors(errors)
    _echo_steps(*jobs_api.first_steps(dsn, job_id, jobs_api.STEPS_SHOWN))
    _echo_links("waits on", dependencies)
    _echo_links("waited on by", dependents)


@jobs.command("wait")
@click.argument("job_id", type=JOB_ID)
@click.option("--timeout", "timeout_s", type=Seconds(), default=60.0, show_default=True,
              help="Seconds to wait; exit 1 if the job has not ended by then.")
@json_option
@dsn_option
@one_line_errors
def wait_command(job_id: int, timeout_s: float, as_json: bool, dsn: str | None) -> None:
    """Wait until a job is done, failed or cancelled, then show it: exit 0 when done, 1 when
    it ended failed or cancelled (saying so on stderr) or is still not done at --timeout."""
    job = jobs_api.wait_for(resolve_dsn(dsn, start=False), job_id, timeout_s)
    _echo_job(job, as_json)
    if job.status != "done":
        error = (job.last_error or "").strip().splitlines()[0] if job.last_error else ""
        click.echo(f"job {job.id} ended {job.status}" + (f": {error}" if error else ""), err=True)
        sys.exit(1)


def _echo_job(job: jobs_api.JobInfo, as_json: bool) -> None:
    if as_json:
        click.echo(jobs_api.dumps_json(job.to_json()))
        return
    for key, value in job.to_json().items():
        if key in ("payload", "result") or (key == "progress" and value is not None):
            value = jobs_api.dumps_json(value)
        first, *rest = str(value).splitlines() or [""]
        click.echo(f"{key:>13}: {first}")
        for line in rest:  # a last_error with its traceback stays under its key
            click.echo(f"{'':>15}{line}")


def _echo_links(title: str, links: list[jobs_api.LinkInfo]) -> None:
    """A job's dependencies or dependents after its steps, when it has any: a count, then a
    line each (50 at most)."""
    if not links:
        return
    click.echo(f"{title:>13}: {len(links)}")
    for link in links[:jobs_api.STEPS_SHOWN]:
        click.echo(f"  {link.id}  {link.kind or '-'}  {link.status or 'deleted'}")
    if len(links) > jobs_api.STEPS_SHOWN:
        click.echo(f"  … and {len(links) - jobs_api.STEPS_SHOWN} more (--json lists them all)")


def _echo_errors(errors: list[jobs_api.ErrorInfo]) -> None:
    """The failed attempts after the job's fields, oldest first: a line each (attempt, when,
    error), its traceback indented below it."""
    if not errors:
        return
    click.echo(f"{'errors':>13}: {len(errors)}")
    for e in errors:
        click.echo(f"  attempt {e.attempt:<3}  {in_utc(e.at).isoformat()}  {e.error or ''}")
        for line in (e.traceback or "").splitlines():
            click.echo(f"      {line}")


def _echo_steps(steps: list[jobs_api.StepInfo], total: int) -> None:
    """The steps after the job's fields: a count, then a line each, then how many are left out."""
    click.echo(f"{'steps':>13}: {total or 'none'}")
    width = max((len(s.name) for s in steps), default=0)
    for s in steps:
        click.echo(f"  {s.name:<{width}}  attempt {s.attempt:<3}  {in_utc(s.recorded_at).isoformat()}  {s.bytes} bytes")
    if total > len(steps):
        click.echo(f"  … and {total - len(steps)} more (--json lists them all)")


def _change_command(action: str, ids: tuple[int, ...], as_json: bool, dsn: str | None) -> None:
    dsn = resolve_dsn(dsn)
    try:
        changed = getattr(jobs_api, action)(dsn, list(ids))
    except jobs_api.JobsError as exc:
        if "no job " in str(exc) or "no such job" in str(exc):
            raise jobs_api.JobsError(f"{exc}{schema_hint(dsn)}") from None
        raise
    _echo_changed(action, changed, as_json)


def _skipped(action: str, changed: int) -> list[tuple[int, str]]:
    """The ids a change by id left as they were (``jobs.Changed.skipped``), said on stderr."""
    skipped = list(getattr(changed, "skipped", ()))
    if skipped:
        shown = "; ".join(f"job {job_id}: {why}" for job_id, why in skipped[:10])
        more = f"; and {len(skipped) - 10} more" if len(skipped) > 10 else ""
        click.echo(f"not {_DONE[action]} ({len(skipped)}): {shown}{more}", err=True)
    return skipped


_DONE = {"retry": "queued again", "cancel": "cancelled", "delete": "deleted", "wake": "woken"}


def _echo_changed(action: str, changed: int, as_json: bool, *, steps_reset: bool = False) -> None:
    forgotten = f", {'its' if changed == 1 else 'their'} steps forgotten" if steps_reset and changed else ""
    skipped = _skipped(action, changed)
    click.echo(orjson.dumps({action: int(changed), **({"skipped": [{"id": i, "why": w} for i, w in skipped]}
                                                      if skipped else {})}).decode() if as_json
               else f"{changed} job{'' if changed == 1 else 's'} {_DONE[action]}{forgotten}")


@jobs.command("update")
@click.argument("job_id", type=JOB_ID)
@click.option("--run-at", default=None, help="When it may run: an ISO 8601 time (UTC when it names no zone).")
@click.option("--delay", type=Duration(), default=None, help="Run it this long from now instead (30s, 10m, 2h).")
@click.option("--priority", type=click.IntRange(-2**31, 2**31 - 1), default=None, help="Its new priority.")
@click.option("--queue", type=UTF8, default=None, help="Its new queue.")
@json_option
@dsn_option
@one_line_errors
def update_command(job_id: int, run_at: str | None, delay: float | None, priority: int | None, queue: str | None,
                   as_json: bool, dsn: str | None) -> None:
    """Change a queued job (due or scheduled): its time, priority or queue; refused for a job
    that runs, waits on others or has ended."""
    moment = None
    if run_at is not None:
        try:
            moment = datetime.fromisoformat(run_at)
        except ValueError:
            raise jobs_api.JobsError(f"--run-at {run_at!r}: expected an ISO 8601 time") from None
    job = jobs_api.update(resolve_dsn(dsn), job_id, run_at=moment, delay_s=delay, priority=priority, queue=queue)
    if as_json:
        click.echo(jobs_api.dumps_json(job.to_json()))
        return
    click.echo(f"job {job.id} updated: run_at {in_utc(job.run_at).isoformat()}, priority {job.priority}, "
               f"queue {job.queue}")


@jobs.command("retry")
@click.argument("job_ids", type=JOB_ID, nargs=-1)
@click.option("--failed", is_flag=True, help="Retry every failed job (with the filters below).")
@filter_options
@click.option("--dry-run", is_flag=True, help="With filters: say how many jobs it would retry, change nothing.")
@click.option("--reset-steps", is_flag=True,
              help="Forget the jobs' recorded steps: their code runs again (by default they are kept and replayed).")
@json_option
@dsn_option
@one_line_errors
def retry_command(job_ids: tuple[int, ...], failed: bool, status: tuple[str, ...], kind: str | None,
                  queue: str | None, key: str | None, tags: tuple[str, ...], since: str | None,
                  error_contains: str | None, dry_run: bool, reset_steps: bool, as_json: bool, dsn: str | None) -> None:
    """Queue failed or cancelled jobs again, keeping their recorded steps unless --reset-steps:
    by id, every failed one (--failed), or every one the filters pick (--tag, --kind, ...)."""
    if failed and job_ids:
        raise jobs_api.JobsError("give job ids or --failed, not both")
    filters = _filters(status or (("failed",) if failed else ()), kind, queue, key, tags, since, error_contains)
    if failed and not dry_run and not any((status, key, tags, since, error_contains)):  # as before filters came
        tty = sys.stderr.isatty()
        if tty:  # one all-or-nothing statement: no count until it commits
            click.echo("queueing failed jobs again…", nl=False, err=True)
        changed = jobs_api.retry_failed(resolve_dsn(dsn), kind=kind, queue=queue, reset_steps=reset_steps)
        if tty:
            click.echo("\r\033[K", nl=False, err=True)
        _echo_changed("retry", changed, as_json, steps_reset=reset_steps)
        return
    if _bulk("retry", job_ids, filters, dry_run, as_json, dsn, reset_steps=reset_steps):
        return
    if not job_ids:
        raise jobs_api.JobsError("give job ids or --failed, or filters (--tag, --kind, --status, ...)")
    changed = jobs_api.retry(resolve_dsn(dsn), list(job_ids), reset_steps=reset_steps)
    _echo_changed("retry", changed, as_json, steps_reset=reset_steps)


@jobs.command("cancel")
@click.argument("job_ids", type=JOB_ID, nargs=-1)
@filter_options
@click.option("--dry-run", is_flag=True, help="With filters: say how many jobs it would cancel, change nothing.")
@json_option
@dsn_option
@one_line_errors
def cancel_command(job_ids: tuple[int, ...], status: tuple[str, ...], kind: str | None, queue: str | None,
                   key: str | None, tags: tuple[str, ...], since: str | None, error_contains: str | None,
                   dry_run: bool, as_json: bool, dsn: str | None) -> None:
    """Cancel queued, waiting or running jobs (a running one's handler is stopped), by id or
    every one the filters pick (--tag, --kind, --status, ...)."""
    if not _bulk("cancel", job_ids, _filters(status, kind, queue, key, tags, since, error_contains), dry_run,
                 as_json, dsn):
        _change_command("cancel", _required(job_ids, "cancel"), as_json, dsn)


@jobs.command("wake")
@click.argument("job_ids", type=JOB_ID, nargs=-1, required=True)
@json_option
@dsn_option
@one_line_errors
def wake_command(job_ids: tuple[int, ...], as_json: bool, dsn: str | None) -> None:
    """Wake sleeping jobs (job.sleep) now: their next run passes the sleep. Refused, nothing
    changed, for a job that does not sleep (one waiting on an event: send it, or cancel the job)."""
    _change_command("wake", job_ids, as_json, dsn)


@jobs.command("delete")
@click.argument("job_ids", type=JOB_ID, nargs=-1)
@filter_options
@click.option("--dry-run", is_flag=True, help="With filters: say how many jobs it would delete, change nothing.")
@json_option
@dsn_option
@one_line_errors
def delete_command(job_ids: tuple[int, ...], status: tuple[str, ...], kind: str | None, queue: str | None,
                   key: str | None, tags: tuple[str, ...], since: str | None, error_contains: str | None,
                   dry_run: bool, as_json: bool, dsn: str | None) -> None:
    """Delete jobs that are not running, by id or every one the filters pick."""
    if not _bulk("delete", job_ids, _filters(status, kind, queue, key, tags, since, error_contains), dry_run,
                 as_json, dsn):
        _change_command("delete", _required(job_ids, "delete"), as_json, dsn)


def _required(ids: tuple[int, ...], action: str) -> tuple[int, ...]:
    if not ids:
        raise jobs_api.JobsError(f"{action}: give job ids, or filters (--tag, --kind, --status, ...)")
    return ids
