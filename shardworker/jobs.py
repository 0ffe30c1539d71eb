"""Operating on jobs without SQL: list, show (with their recorded steps and their failed
attempts' errors), wait for (and
``wait_for_async``), update, retry, cancel, delete.

Each function takes an open psycopg connection (the caller's; used as ``enqueue`` uses it)
or a DSN string. Changes are all or nothing: every id is checked, under a row lock that
keeps workers from claiming or finishing the jobs meanwhile, and one unknown id or one job
in the wrong state refuses the whole call with ``JobsError`` naming it.

* ``retry``: a ``failed`` or ``cancelled`` job is queued again, due now, with at least one
  attempt left (``max_attempts`` grows if it was used up); its history stays, and so do its
  recorded steps (the next attempt replays them) unless ``reset_steps``: then they are
  forgotten, and their code runs again.
* ``cancel``: a ``queued``, ``waiting`` or ``running`` job becomes ``cancelled`` at once, and
  so do the jobs waiting on it. A queued or waiting one is never claimed; a running one's
  worker stops its handler (an ``async def`` one is cancelled, a sync one sees
  ``job.cancelled``, and past ``--cancel-grace`` its child is stopped), and its late outcome
  is never applied.
* ``delete``: any job that is not ``running`` (the jobs waiting on it are cancelled).
* ``wake``: a sleeping job (``job.sleep``) is queued now; its next run passes the sleep.
* ``retry_matching``, ``cancel_matching``, ``delete_matching``: the same, for every job a set
  of filters picks (status, kind, queue, key, since, tags, a text in the last error), with a
  dry run that counts; the jobs the action does not apply to are left alone.
* ``update``: a ``queued`` job's run_at (or a delay from now), priority or queue; refused
  for a job that runs, waits on others or has ended.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from shardworker.client import using_schema
from shardworker.core.views import ErrorInfo, JobInfo, LinkInfo, StepInfo
from shardworker.errors import JobsError, ShardworkerError, WaitTimeout

STATUSES = ("waiting", "queued", "running", "done", "failed", "cancelled")
STEPS_SHOWN = 50  # steps listed on a job's page (`jobs show` without --json, the dashboard); a job may hold 10,000
_WHO = {"retry": "only failed or cancelled jobs can be retried",
        "cancel": "only queued, waiting or running jobs can be cancelled",
        "delete": "any job but a running one can be deleted"}
_ALLOWED = {"retry": ("failed", "cancelled"), "cancel": ("queued", "waiting", "running"),
            "delete": ("waiting", "queued", "done", "failed", "cancelled")}


def parse_since(text: str | None, what: str = "--since") -> datetime | None:
    """``30m``, ``2h``, ``7d`` ago, or an ISO 8601 time (naive: UTC); None for None;
    ``JobsError`` naming ``what`` for anything else."""
    from shardworker.core.config import duration_seconds
    from shardworker.core.limits import MAX_DELAY_S

    if text is None:
        return None
    seconds = duration_seconds(text)
    if seconds is not None:
        if seconds > MAX_DELAY_S:
            raise JobsError(f"{what} {text!r} is beyond the longest duration, 100 years (36525d)")
        return datetime.now(UTC) - timedelta(seconds=seconds)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise JobsError(f"{what} {text!r}: expected a duration (30m, 2h, 7d) or an ISO 8601 time") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def dumps_json(value: Any, *, indent: bool = False) -> str:
    """``value`` as JSON text, every number exactly: orjson, or the standard library for a
    payload or result holding an integer beyond 64 bits (enqueue refuses them, but a row
    written by other means may hold one, and orjson cannot write it)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2 if indent else None).decode()
    except TypeError:
        return json.dumps(value, ensure_ascii=False, indent=2 if indent else None,
                          separators=None if indent else (",", ":"))


def list_jobs(conn_or_dsn: Any, *, status: Sequence[str] | str | None = None, kind: str | None = None,
              queue: str | None = None, since: datetime | None = None, limit: int = 50,
              key: str | None = None, tag: Sequence[str] | str | None = None,
              error_contains: str | None = None) -> list[JobInfo]:
    """Jobs newest first, filtered by status (one or several), kind, queue, key, creation time,
    tags (a job holding every one given) and a text its last error contains (any case)."""
    if not isinstance(limit, int) or limit < 1:
        raise JobsError(f"limit must be a positive integer, got {limit!r}")
    from shardworker.store import job_queries

    return job_queries.list_jobs(conn_or_dsn, _filter(status, kind, queue, key, since, tag, error_contains), limit)


def retry_matching(conn_or_dsn: Any, *, status: Sequence[str] | str | None = None, kind: str | None = None,
                   queue: str | None = None, key: str | None = None, since: datetime | None = None,
                   tag: Sequence[str] | str | None = None, error_contains: str | None = None,
                   dry_run: bool = False, reset_steps: bool = False) -> int:
    """Queue again every failed or cancelled job the filters pick (as ``list_jobs``'s; at least
    one), keeping their steps unless ``reset_steps``; how many (with ``dry_run``: how many it
    would, changing none). Jobs a worker or another change holds at that moment are left out.
    At most 100,000 a call: call again."""
    where = _filter(status, kind, queue, key, since, tag, error_contains)
    return _change_matching(conn_or_dsn, "retry", where, dry_run, reset_steps)


def cancel_matching(conn_or_dsn: Any, *, status: Sequence[str] | str | None = None, kind: str | None = None,
                    queue: str | None = None, key: str | None = None, since: datetime | None = None,
                    tag: Sequence[str] | str | None = None, error_contains: str | None = None,
                    dry_run: bool = False) -> int:
    """Cancel every queued, waiting or running job the filters pick (and the jobs waiting on
    them), as ``cancel`` does; how many, as ``retry_matching`` counts."""
    return _change_matching(conn_or_dsn, "cancel", _filter(status, kind, queue, key, since, tag, error_contains),
                            dry_run)


def delete_matching(conn_or_dsn: Any, *, status: Sequence[str] | str | None = None, kind: str | None = None,
                    queue: str | None = None, key: str | None = None, since: datetime | None = None,
                    tag: Sequence[str] | str | None = None, error_contains: str | None = None,
                    dry_run: bool = False) -> int:
    """Delete every job the filters pick that is not running (the jobs waiting on them are
    cancelled); how many, as ``retry_matching`` counts."""
    return _change_matching(conn_or_dsn, "delete", _filter(status, kind, queue, key, since, tag, error_contains),
                            dry_run)


def _filter(status: Sequence[str] | str | None, kind: str | None, queue: str | None, key: str | None,
            since: datetime | None, tag: Sequence[str] | str | None, error_contains: str | None) -> Any:
    from shardworker.store.job_queries import JobFilter

    statuses = [status] if isinstance(status, str) else list(status or [])
    unknown = [s for s in statuses if s not in STATUSES]
    if unknown:
        raise JobsError(f"unknown status {unknown[0]!r}; expected one of {', '.join(STATUSES)}")
    tags = [tag] if isinstance(tag, str) else list(tag or [])
    if any(not isinstance(t, str) or not t for t in tags):
        raise JobsError("a tag to look for must be a non-empty string")
    if error_contains is not None and (not isinstance(error_contains, str) or not error_contains):
        raise JobsError("error_contains must be a non-empty string")
    if since is not None and not isinstance(since, datetime):
        raise JobsError(f"since must be a datetime, got {type(since).__name__}")
    moment = None if since is None else since if since.tzinfo else since.replace(tzinfo=UTC)
    return JobFilter(statuses or None, kind, queue, key, moment, tags or None, error_contains)


def _change_matching(conn_or_dsn: Any, action: str, where: Any, dry_run: bool, reset_steps: bool = False) -> int:
    if not any(value is not None for value in where):
        raise JobsError(f"{action}: give at least one filter (a status, kind, queue, key, time, tag or error text): "
                        "a bulk change of every job is refused")
    from shardworker.store import job_queries

    allowed = [s for s in _ALLOWED[action] if where.statuses is None or s in where.statuses]
    return job_queries.change_matching(conn_or_dsn, action, where, allowed, dry_run=bool(dry_run),
                                       reset_steps=bool(reset_steps))


def get_job(conn_or_dsn: Any, job_id: int, *, schema: str | None = None) -> JobInfo | None:
    """One job, or None when no job has that id."""
    with using_schema(schema):
        from shardworker.store import job_queries

        return job_queries.get_job(conn_or_dsn, _id(job_id))


def get_errors(conn_or_dsn: Any, job_id: int) -> list[ErrorInfo]:
    """A job's last failed attempts (up to ``limits.ERRORS_KEPT``, oldest first), each with its
    error, traceback and when it failed; empty for a job that never failed, or without a row."""
    from shardworker.store import job_queries

    return job_queries.get_errors(conn_or_dsn, _id(job_id))


def get_steps(conn_or_dsn: Any, job_id: int) -> list[StepInfo]:
    """A job's recorded steps (``job.step``), in the order they were recorded, then by name;
    empty for a job without steps, or without a row."""
    return first_steps(conn_or_dsn, job_id, None)[0]


def first_steps(conn_or_dsn: Any, job_id: int, limit: int | None) -> tuple[list[StepInfo], int]:
    """The first ``limit`` (None: all) of ``get_steps``, and how many steps the job holds in
    all: what a page shows of a job that may hold 10,000 (sizes are read only for those)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise JobsError(f"limit must be a positive integer, got {limit!r}")
    from shardworker.store import job_queries

    return job_queries.get_steps(conn_or_dsn, _id(job_id), limit)


def get_links(conn_or_dsn: Any, job_id: int) -> tuple[list[LinkInfo], list[LinkInfo]]:
    """(dependencies, dependents): the jobs ``job_id`` waits on (``after=``) and the jobs
    waiting on it, each with its kind and status (None when deleted), by id."""
    from shardworker.store import job_queries

    return job_queries.get_links(conn_or_dsn, _id(job_id))


def wait_for(conn_or_dsn: Any, job_id: int, timeout_s: float = 60.0, *,
             on_progress: Callable[[Any], Any] | None = None, schema: str | None = None) -> JobInfo:
    """The job once it is ``done``, ``failed`` or ``cancelled``: it LISTENs for the end, and
    reads the job again every second all the same (through a transaction pool such as
    PgBouncer no notification comes). ``WaitTimeout`` (a ``TimeoutError``) when ``timeout_s`` runs out first,
    ``JobsError`` when no job has that id (or it is deleted while waited on).

    On your own connection it must be outside a transaction (notifications arrive only
    between transactions). It holds that connection while it waits: from a web request,
    prefer a connection of its own (pass the DSN) or a pool's. In asyncio code, await
    ``wait_for_async`` (this one refuses a ``psycopg.AsyncConnection``, naming it).

    ``on_progress``: called with each new value the job reports (``job.progress``) while it
    is waited on, read four times a second, and with the last one before the wait returns.
    """
    with using_schema(schema):
        job_id, timeout_s = _id(job_id), _timeout(timeout_s)
        _callable(on_progress)
        from shardworker.store import job_queries

        return _ended(job_id, timeout_s, *job_queries.wait_job_end(conn_or_dsn, job_id, timeout_s, on_progress))


async def wait_for_async(aconn_or_dsn: Any, job_id: int, timeout_s: float = 60.0, *,
                         on_progress: Callable[[Any], Any] | None = None, schema: str | None = None) -> JobInfo:
    """``wait_for`` for asyncio code: ``await wait_for_async(aconn, job_id)`` on a
    ``psycopg.AsyncConnection`` (outside a transaction; held while it waits) or a DSN. The
    event loop runs on while it waits; the same errors. ``on_progress`` may be a coroutine function."""
    with using_schema(schema):
        job_id, timeout_s = _id(job_id), _timeout(timeout_s)
        _callable(on_progress)
        from shardworker.store.wait_async import wait_job_end_async

        return _ended(job_id, timeout_s, *await wait_job_end_async(aconn_or_dsn, job_id, timeout_s, on_progress))


def _callable(on_progress: Any) -> None:
    if on_progress is not None and not callable(on_progress):
        raise JobsError(f"on_progress must be a function of one value, got {type(on_progress).__name__}")


def wake(conn_or_dsn: Any, job_ids: Sequence[int]) -> int:
    """Wake sleeping jobs now (``job.sleep``): each is queued at once, and its next run passes
    the sleep. All or nothing: a job that is not sleeping (one waiting on an event or on other
    jobs, or not waiting) refuses the call with ``JobsError`` naming it; how many."""
    ids = sorted({_id(i) for i in job_ids})
    if not ids:
        raise JobsError("wake: no job ids given")
    from shardworker.store import event_queries

    def check(found: dict[int, tuple[str, str | None]]) -> None:
        missing = [i for i in ids if i not in found]
        if missing:
            raise JobsError(f"wake: no job {missing[0]}; nothing changed")
        for job_id, (status, wait) in found.items():
            if wait == "sleep":
                continue
            why = {"event": "it waits for an event: send it (shardworker events send) or cancel the job",
                   "jobs": "it waits on the jobs it was enqueued after"}.get(wait or "", f"it is {status}")
            raise JobsError(f"cannot wake job {job_id}: {why}; only a sleeping job (job.sleep) can be woken; "
                            "nothing changed")

    return event_queries.wake_jobs(conn_or_dsn, ids, check)


def _timeout(timeout_s: Any) -> float:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s >= 0:
        raise JobsError(f"timeout_s must be a number of seconds >= 0, got {timeout_s!r}")
    return float(timeout_s)


def _ended(job_id: int, timeout_s: float, job: JobInfo | None, ended: bool) -> JobInfo:
    """What a wait returns or raises: the job once ended, else ``JobsError`` (no such job)
    or ``WaitTimeout``."""
    if job is None:
        raise JobsError(f"no job {job_id}")
    if not ended:
        raise WaitTimeout(f"job {job_id} is still {job.status} after {timeout_s:g}s")
    return job


def retry(conn_or_dsn: Any, job_ids: Sequence[int], reset_steps: bool = False) -> Changed:
    """Queue failed or cancelled jobs again, keeping their recorded steps, or forgetting them
    when ``reset_steps`` (in the same transaction); a job that waited on others goes back to
    waiting on those not done now. How many; the ids it left, and why, in ``.skipped``
    (``Changed``: one whose dependency was deleted can never run, and stays); ``JobsError``
    when none can be."""
    return _change(conn_or_dsn, "retry", job_ids, reset_steps=reset_steps)


def retry_failed(conn_or_dsn: Any, *, kind: str | None = None, queue: str | None = None,
                 reset_steps: bool = False) -> int:
    """Queue every failed job (of ``kind``, in ``queue``) again, keeping their recorded steps
    unless ``reset_steps``; how many."""
    from shardworker.store import job_queries

    return job_queries.retry_failed(conn_or_dsn, kind, queue, reset_steps=bool(reset_steps))


def cancel(conn_or_dsn: Any, job_ids: Sequence[int]) -> Changed:
    """Cancel queued, waiting or running jobs, and (transitively) the jobs waiting on them;
    how many of ``job_ids`` (the others, and why, in ``.skipped``; ``JobsError`` when none can
    be). A running job ends ``cancelled`` at once: its worker stops the
    handler (an ``async def`` one is cancelled, a sync one sees ``job.cancelled``; past the
    worker's ``--cancel-grace`` its child is stopped), and its late outcome is never applied."""
    return _change(conn_or_dsn, "cancel", job_ids)


def delete(conn_or_dsn: Any, job_ids: Sequence[int]) -> Changed:
    """Delete jobs that are not running (the jobs waiting on them are cancelled); how many
    (the others, and why, in ``.skipped``; ``JobsError`` when none can be)."""
    return _change(conn_or_dsn, "delete", job_ids)


def update(conn_or_dsn: Any, job_id: int, *, run_at: datetime | None = None, delay_s: float | None = None,
           priority: int | None = None, queue: str | None = None) -> JobInfo:
    """Change a queued job (due now or scheduled later): its ``run_at`` (or now + ``delay_s``),
    ``priority`` or ``queue``, those given; the job as changed. Refused (``JobsError``, nothing
    changed) for a job that is not queued: one that runs, waits on others or has ended."""
    from shardworker.client import check_delay
    from shardworker.queues import check_name
    from shardworker.store import job_queries

    job_id = _id(job_id)
    if run_at is None and delay_s is None and priority is None and queue is None:
        raise JobsError("update: give a run_at, a delay, a priority or a queue")
    if run_at is not None and delay_s is not None:
        raise JobsError("update: give a run_at or a delay, not both")
    if run_at is not None and not isinstance(run_at, datetime):
        raise JobsError(f"update: run_at must be a datetime, got {type(run_at).__name__}")
    if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)
                                 or not -2**31 <= priority < 2**31):
        raise JobsError("update: priority must be a 32-bit integer")
    try:
        delay = None if delay_s is None else check_delay(delay_s)
        name = None if queue is None else check_name(queue)
    except ShardworkerError as exc:
        raise JobsError(f"update: {exc}") from None
    moment = None if run_at is None else run_at if run_at.tzinfo else run_at.replace(tzinfo=UTC)
    job, status = job_queries.update_job(conn_or_dsn, job_id, {"run_at": moment, "delay_s": delay,
                                                               "priority": priority, "queue": name})
    if job is None:
        if status is None:
            raise JobsError(f"no job {job_id}")
        if status == "queued":  # refused only for a time: a rescued job waiting its grace
            raise JobsError(f"cannot move job {job_id}'s time: it was rescued: it waits its grace (--rescue-grace) so "
                            "its silent worker's late outcome can land first; nothing changed")
        raise JobsError(f"cannot update job {job_id}: it is {status}; only a queued job (due or scheduled) can be "
                        "updated; nothing changed")
    return job


class Changed(int):
    """How many jobs ``retry``, ``cancel`` or ``delete`` changed (an ``int``), and
    ``skipped``: the ids it left as they were, each with why ((id, "no such job"), (id, "it
    is done"), ...), in id order."""

    skipped: tuple[tuple[int, str], ...]

    def __new__(cls, changed: int, skipped: Sequence[tuple[int, str]] = ()) -> Changed:
        made = super().__new__(cls, changed)
        made.skipped = tuple(skipped)
        return made


def _change(conn_or_dsn: Any, action: str, job_ids: Sequence[int], *, reset_steps: bool = False) -> Changed:
    """``action`` on each of ``job_ids`` whose status allows it, in one transaction; the others
    are left as they are and reported (``Changed.skipped``): a job that finished or was deleted
    meanwhile does not hold up the rest. When none of them allows it, ``JobsError`` says why
    (the first one's reason), nothing changed."""
    ids = sorted({_id(i) for i in job_ids})
    if not ids:
        raise JobsError(f"{action}: no job ids given")
    from shardworker.store import job_queries

    skipped: dict[int, str] = {}

    def refuse_if_none_changed() -> None:
        if len(skipped) < len(ids):
            return
        if len(ids) == 1:
            (job_id, why), = skipped.items()
            if why == "no such job":
                raise JobsError(f"{action}: no job {job_id}; nothing changed")
            raise JobsError(f"cannot {action} job {job_id}: {why}; {_WHO[action]}; nothing changed")
        reasons = "; ".join(f"job {job_id}: {why}" for job_id, why in list(skipped.items())[:10])
        more = f"; and {len(skipped) - 10} more" if len(skipped) > 10 else ""
        raise JobsError(f"cannot {action} any of the {len(ids)} jobs ({reasons}{more}); {_WHO[action]}; "
                        "nothing changed")

    def check(found: dict[int, str]) -> list[int]:
        for job_id in ids:
            status = found.get(job_id)
            if status is None:
                skipped[job_id] = "no such job"
            elif status not in _ALLOWED[action]:
                why = " (its handler is running; its outcome will land)" if status == "running" else ""
                skipped[job_id] = f"it is {status}{why}"
        refuse_if_none_changed()
        return [job_id for job_id in ids if job_id not in skipped]

    def done(changed: set[int]) -> None:
        for job_id in ids:  # allowed, yet not changed: a retry of a job whose dependency was deleted
            if job_id not in skipped and job_id not in changed:
                skipped[job_id] = "a job it waited on was deleted: it can never run"
        refuse_if_none_changed()

    changed = job_queries.change_jobs(conn_or_dsn, action, ids, check, done, reset_steps=bool(reset_steps))
    return Changed(changed, sorted(skipped.items()))


def _id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise JobsError(f"not a job id: {value!r}")
    return value
