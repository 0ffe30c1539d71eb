"""``shardworker outbox status|drain|reapply|verify``: operator commands that work with the
database down (status, verify) or wait for it (drain, reapply)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, NamedTuple

import click
import orjson

from shardworker.cli.common import (
    Seconds,
    dsn_option,
    json_option,
    one_line_errors,
    outbox_dir_option,
    resolve_dsn,
)

if TYPE_CHECKING:
    from outbox import OutboxStatus


@click.group()
def outbox() -> None:
    """Inspect and drain the local outbox."""


@outbox.command()
@outbox_dir_option
@json_option
@one_line_errors
def status(outbox_dir: str, as_json: bool) -> None:
    """Pending outcomes per shard, bytes, oldest age; works with the database down."""
    from outbox import is_locked
    from outbox import status as outbox_status
    from shardworker.core import layout
    from shardworker.errors import ShardworkerError

    if not os.path.isdir(outbox_dir):
        raise ShardworkerError(f"no outbox directory at {outbox_dir}")
    st = outbox_status(outbox_dir)
    worker = is_locked(os.path.join(outbox_dir, layout.WORKER_LOCK))
    kept = _count_kept(outbox_dir)
    if as_json:
        _echo_status_json(outbox_dir, st, worker, kept)
    else:
        _echo_status_text(outbox_dir, st, worker, kept)


class _Kept(NamedTuple):
    """What an outbox directory keeps besides its segments, counted for ``status``."""

    stale: int  # of them, ``cancelled`` kept because their jobs were cancelled while they ran
    cancelled: int
    setaside: int
    lost: int
    deadletters: int
    give_jobs: int
    give_claims: int


def _count_kept(outbox_dir: str) -> _Kept:
    from shardworker.core import layout

    stale, cancelled = layout.count_stale(outbox_dir), layout.count_cancelled_kept(outbox_dir)
    setaside = layout.count_setaside(outbox_dir)
    lost = layout.count_lines(layout.lost_log(outbox_dir))
    deadletters = layout.count_deadlettered(outbox_dir)
    give_jobs, give_claims = layout.count_giveback(outbox_dir)
    return _Kept(stale, cancelled, setaside, lost, deadletters, give_jobs, give_claims)


def _echo_status_json(outbox_dir: str, st: OutboxStatus, worker: bool, kept: _Kept) -> None:
    click.echo(orjson.dumps({
        "directory": outbox_dir, "pending": st.pending, "worker_running": worker,
        "flusher_running": st.flusher_alive, "quarantined": st.quarantined, "torn_tails": st.torn_tails,
        "stale_outcomes": kept.stale, "cancelled_outcomes": kept.cancelled, "set_aside_outcomes": kept.setaside,
        "requeued_after_quarantine": kept.lost,
        "deadlettered": kept.deadletters, "to_give_back": {"jobs": kept.give_jobs, "claims": kept.give_claims},
        "kept_for_reapply": {"records": _kept_records(outbox_dir), "bytes": st.kept_bytes,
                             "segments": st.kept_segments, "oldest_age_s": st.kept_oldest_age_s},
        "shards": [{"shard": s.shard, "pending": s.pending, "bytes": s.pending_bytes,
                    "oldest_age_s": s.oldest_age_s, "segments": s.segments,
                    "sealed_segments": s.sealed_segments, "kept_bytes": s.kept_bytes,
                    "writer_alive": s.writer_alive} for s in st.shards]}).decode())


def _kept_records(outbox_dir: str) -> int:
    from outbox import kept_records

    return kept_records(outbox_dir)


def _echo_status_text(outbox_dir: str, st: OutboxStatus, worker: bool, kept: _Kept) -> None:
    from shardworker.core import layout

    click.echo(f"outbox {outbox_dir}: {st.pending} pending; worker {'running' if worker else 'not running'}, "
               f"flusher {'running' if st.flusher_alive else 'not running'}")
    if st.kept_segments and st.kept_oldest_age_s is not None:
        click.echo(f"  kept for re-applying: {_kept_records(outbox_dir)} applied records, {st.kept_bytes} bytes, "
                   f"the oldest applied {st.kept_oldest_age_s:.0f}s ago (run --reapply-window; `shardworker outbox "
                   "reapply` after a restore)")
    for s in st.shards:
        age = "-" if s.oldest_age_s is None else f"{s.oldest_age_s:.1f}s"
        click.echo(f"  shard {s.shard:4d}: {s.pending} pending, {s.pending_bytes} bytes, oldest {age}, "
                   f"{s.segments} segment(s) ({s.sealed_segments} sealed){', writer alive' if s.writer_alive else ''}")
    for name in st.quarantined:
        click.echo(f"  QUARANTINED {name}")
    for name in st.torn_tails:
        click.echo(f"  torn tail kept: {name}")
    if kept.stale > kept.cancelled:
        click.echo(f"  {kept.stale - kept.cancelled} stale outcome(s) kept, not applied (their attempts were rescued "
                   f"and claimed again); see {layout.STALE_LOG}")
    if kept.cancelled:
        click.echo(f"  {kept.cancelled} outcome(s) kept, not applied (their jobs were cancelled while they ran); "
                   f"see {layout.STALE_LOG}")
    if kept.setaside:
        click.echo(f"  {kept.setaside} outcome(s) set aside, their jobs missing from the database; see "
                   f"{layout.SETASIDE_LOG}")
    if kept.lost:
        click.echo(f"  {kept.lost} job(s) requeued, charged an attempt, because their outcomes were lost (in a "
                   f"quarantined segment, or gone with a database that went back past the kept window); see "
                   f"{layout.LOST_LOG}")
    if kept.deadletters:
        click.echo(f"  {kept.deadletters} outcome(s) dead-lettered in {layout.DEADLETTER_DIR}/")
    if kept.give_jobs or kept.give_claims:
        click.echo(f"  {kept.give_jobs} unstarted job(s) and {kept.give_claims} lost claim(s) to give back, "
                   f"uncharged, at the next start or drain; see {layout.GIVEBACK_FILE}")


@outbox.command()
@outbox_dir_option
@click.option("--timeout", type=Seconds(), default=300.0, show_default=True,
              help="Seconds to keep retrying while the database is unreachable.")
@dsn_option
@one_line_errors
def drain(outbox_dir: str, timeout: float, dsn: str | None) -> None:
    """Apply every pending outcome and exit 0 when the outbox is empty."""
    from outbox import status as outbox_status
    from shardworker.errors import ShardworkerError
    from shardworker.worker.drain import drain as drain_outbox

    total = outbox_status(outbox_dir).pending if os.path.isdir(outbox_dir) else 0
    dsn = _drain_dsn(outbox_dir, dsn, total)
    # A bar on a terminal; nothing at all when stderr is a pipe or a file.
    with click.progressbar(length=max(total, 1), label="draining", file=sys.stderr,
                           hidden=not sys.stderr.isatty()) as bar:
        done = [0]

        def progress(stats: object, _held: int) -> None:
            flushed = getattr(stats, "flushed", 0)
            bar.update(min(flushed, total) - done[0])
            done[0] = min(flushed, total)

        stats = drain_outbox(outbox_dir, dsn, timeout_s=timeout, progress=progress)
    click.echo(f"drained {stats.flushed - stats.steps} outcomes: {stats.applied} applied, {stats.replayed} already "
               f"applied, {stats.stale} stale, {stats.missing} set aside, {stats.deadlettered} dead-lettered"
               + (f", {stats.cancelled} kept (their jobs were cancelled)" if stats.cancelled else "")
               + (f"; and {stats.steps} step results" if stats.steps else ""))
    if stats.missing:
        raise ShardworkerError(f"{stats.missing} outcome(s) set aside in {outbox_dir}/setaside.jsonl: their jobs "
                               "do not exist in this database")
    # A segment quarantined (now or earlier) holds outcomes no drain applies: the outbox is
    # not empty, so this is a failure with its reason, not a warning.
    quarantined = outbox_status(outbox_dir).quarantined
    if quarantined:
        raise ShardworkerError(f"{len(quarantined)} quarantined segment(s) in {outbox_dir}/quarantine hold outcomes "
                               f"that were not applied: {', '.join(quarantined)}; see `shardworker outbox verify`")


def _drain_dsn(outbox_dir: str, dsn: str | None, pending: int) -> str:
    """The DSN to drain into: the given one, or the embedded server only when the outbox
    belongs to it; never an embedded server for an outbox that belongs elsewhere."""
    from shardworker.core.binding import bound_to
    from shardworker.errors import ShardworkerError

    if dsn:
        return dsn
    bound = bound_to(outbox_dir) if os.path.isdir(outbox_dir) else None
    if bound is not None and not bound.embedded:
        raise ShardworkerError(f"the outbox {outbox_dir} belongs to {bound.describe()}: pass its --dsn "
                               "(or set SHARDWORKER_DSN)")
    if bound is None and pending:
        raise ShardworkerError(f"the outbox {outbox_dir} does not say which database it belongs to: pass --dsn")
    return resolve_dsn(None)


@outbox.command()
@outbox_dir_option
@click.option("--dry-run", is_flag=True, help="Say how many jobs it would change; change nothing.")
@click.option("--all", "from_start", is_flag=True,
              help="Every record the outbox keeps, not only those past the position the database holds.")
@click.option("--timeout", type=Seconds(), default=300.0, show_default=True,
              help="Seconds to keep retrying while the database is unreachable.")
@json_option
@dsn_option
@one_line_errors
def reapply(outbox_dir: str, dry_run: bool, from_start: bool, timeout: float, as_json: bool, dsn: str | None) -> None:
    """After a restore from a backup: apply again the outcomes, steps and follow-ups this outbox
    kept (run --reapply-window) that the database no longer holds. Run it on each host, with
    the worker stopped (a running worker does this by itself when it finds the database older)."""
    from shardworker.core import layout
    from shardworker.errors import ShardworkerError
    from shardworker.flusher.reapply import preview
    from shardworker.worker.drain import drain as drain_outbox

    if not layout.holds_an_outbox(outbox_dir):
        raise ShardworkerError(f"no outbox at {outbox_dir}: nothing to re-apply (give the --outbox-dir a worker used)")
    dsn = _drain_dsn(outbox_dir, dsn, 1)
    if dry_run:
        seen = preview(outbox_dir, dsn, from_start=from_start, timeout_s=timeout)
        if as_json:
            click.echo(orjson.dumps({"dry_run": True, "records": seen.records, "outcomes": seen.outcomes,
                                     "jobs_changed": seen.jobs_changed, "followups": seen.followups,
                                     "steps": seen.steps}).decode())
        else:
            click.echo(f"would re-apply {seen.records} kept records: {seen.outcomes} outcomes, of which "
                       f"{seen.jobs_changed} would change their jobs (the rest are there already, or stale)"
                       + (f", inserting {seen.followups} follow-up jobs again" if seen.followups else "")
                       + (f"; and {seen.steps} step results" if seen.steps else "") + "; nothing was changed")
        return
    stats = drain_outbox(outbox_dir, dsn, timeout_s=timeout, reapply=True, from_start=from_start, role="reapply")
    if as_json:
        click.echo(orjson.dumps({"dry_run": False, "outcomes": stats.flushed - stats.steps,
                                 "jobs_changed": stats.applied, "already_applied": stats.replayed,
                                 "stale": stats.stale, "set_aside": stats.missing, "followups": stats.followups,
                                 "steps": stats.steps}).decode())
    else:
        click.echo(f"re-applied {stats.flushed - stats.steps} outcomes: {stats.applied} changed their jobs, "
                   f"{stats.replayed} were there already, {stats.stale} stale, {stats.missing} set aside"
                   + (f"; {stats.followups} follow-up jobs inserted again" if stats.followups else "")
                   + (f"; and {stats.steps} step results" if stats.steps else ""))


@outbox.command()
@outbox_dir_option
@one_line_errors
def verify(outbox_dir: str) -> None:
    """Check every record's checksum; report torn tails and corruption (exit 1 on corruption)."""
    from outbox import verify as outbox_verify
    from shardworker.errors import ShardworkerError

    if not os.path.isdir(outbox_dir):
        raise ShardworkerError(f"no outbox directory at {outbox_dir}")
    report = outbox_verify(outbox_dir)
    for seg in report.segments:
        where = "" if seg.bad_offset is None else f" at offset {seg.bad_offset}: {seg.reason}"
        click.echo(f"{seg.state:8s} {seg.path} ({seg.records} records{', sealed' if seg.sealed else ''}){where}")
    if report.corrupt:
        raise ShardworkerError(f"{len(report.corrupt)} corrupt or quarantined segment(s) in {outbox_dir}")
    click.echo(f"ok: {len(report.segments)} segment(s), {len(report.torn)} torn tail(s)")
