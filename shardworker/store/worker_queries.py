"""The worker's queries on its jobs: claim, give back, apply outcomes (fenced by attempt),
and requeue what it lost (notifications: ``shardworker.store.notifications``). ``ApplyResult``
says what a batch did; everything here runs on the worker's own ``Session``."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import replace
from typing import Any, NamedTuple, Protocol

import psycopg
from psycopg.types.json import Jsonb

from shardworker.core import followups
from shardworker.core.flow import Rate
from shardworker.core.followups import DependentRow, followup_uid
from shardworker.core.limits import ERRORS_KEPT, MAX_ERROR_CHARS
from shardworker.core.model import (
    ApplyResult,
    Disposition,
    Mark,
    Outcome,
    ProgressRecord,
    StepRecord,
    dumps_exact,
    loads_exact,
)
from shardworker.errors import EnqueueError, OutcomeRejected, SchemaMissing
from shardworker.store.claiming import ClaimQueries
from shardworker.store.connection import first_line, is_refusal, migrate_command, rollback
from shardworker.store.dependencies import plan_insert, run_plan
from shardworker.store.sql import BinaryList, current_schema, native, native_params, query


class KindLimits(Protocol):
    """A handler's limits across workers (``shardworker.app.HandlerSpec`` has them)."""

    @property
    def kind(self) -> str: ...
    @property
    def global_concurrency(self) -> int | None: ...
    @property
    def key_concurrency(self) -> int | None: ...
    @property
    def rate(self) -> Rate | None: ...


class DatabaseIdentity(NamedTuple):
    """What an outbox is bound to (``shardworker.core.binding``)."""

    instance_id: str
    database: str
    server: str  # host:port


class WorkerQueries(ClaimQueries):
    """Claiming (``shardworker.store.claiming``), applying and giving back for one worker."""

    def register_kinds(self, specs: Sequence[KindLimits]) -> None:
        """Make this worker's handlers' limits across workers the kinds' (``shardworker.kinds``)."""
        ordered = sorted(specs, key=lambda spec: spec.kind)
        with self.cursor() as cur:
            cur.execute(query("flow_register_kinds"), {
                "names": [spec.kind for spec in ordered],
                "global_concurrency": [spec.global_concurrency for spec in ordered],
                "key_concurrency": [spec.key_concurrency for spec in ordered],
                "rate_limit": [spec.rate.n if spec.rate else None for spec in ordered],
                "rate_period_s": [spec.rate.period_s if spec.rate else None for spec in ordered]})

    def release(self, jobs: Sequence[tuple[int, int]], worker_id: str) -> int:
        """Give back (id, attempt) claims whose handler never started."""
        if not jobs:
            return 0
        with self.cursor() as cur:
            cur.execute(query("job_release"), {"ids": [j for j, _ in jobs],
                                               "attempts": [a for _, a in jobs], "worker_id": worker_id})
            return cur.rowcount

    def release_claim(self, claim_token: str, worker_id: str) -> int:
        """Give back the jobs of a claim whose reply was lost; returns how many."""
        with self.cursor() as cur:
            cur.execute(query("job_release_claim"), {"claim_token": claim_token, "worker_id": worker_id})
            return cur.rowcount

    def release_unstarted(self, worker_id: str, started: Collection[int]) -> int:
        """Give back this worker's running jobs except ``started`` (their handlers started)."""
        with self.cursor() as cur:
            cur.execute(query("job_release_unstarted"), {"worker_id": worker_id, "started": sorted(started)})
            return cur.rowcount

    def requeue_orphans(self, worker_id: str, error: str) -> list[int]:
        """Requeue (or fail, when out of attempts) this worker's running jobs."""
        with self.cursor() as cur:
            cur.execute(query("job_requeue_orphans"), {"worker_id": worker_id, "error": error,
                                                       "errors_kept": ERRORS_KEPT})
            return [r[0] for r in cur.fetchall()]

    def requeue_lost(self, worker_id: str, error: str, keep_ids: Sequence[int]) -> list[int]:
        """Requeue this worker's running jobs except ``keep_ids`` (whose outcomes are still coming)."""
        with self.cursor() as cur:
            cur.execute(query("job_requeue_lost"), {"worker_id": worker_id, "error": error,
                                                    "keep_ids": list(keep_ids), "errors_kept": ERRORS_KEPT})
            return [r[0] for r in cur.fetchall()]

    def count_active(self, kinds: Sequence[str], queues: Sequence[str] | None, worker_id: str,
                     retry_horizon_s: float = 0.0) -> int:
        """Jobs due now for these kinds, jobs already attempted that fall due within
        ``retry_horizon_s``, plus jobs running for this worker."""
        with self.cursor() as cur:
            cur.execute(query("job_count_active"), {"kinds": list(kinds),
                                                    "queues": list(queues) if queues else None,
                                                    "worker_id": worker_id, "retry_horizon_s": retry_horizon_s})
            row = cur.fetchone()
        return int(row[0]) if row else 0

    def apply_outcomes(self, outcomes: Sequence[Outcome], steps: Sequence[StepRecord] = (),
                       mark: Mark | None = None, *, timeout_s: float | None = None,
                       note_followups: NoteFollowups | None = None) -> ApplyResult:
        """Apply a batch of outcomes in one fenced statement and its steps' results with them,
        in one transaction: a job's steps are in PostgreSQL no later than the outcome that
        queues it again. A batch is one round trip: BEGIN, the steps, the outcomes and COMMIT
        sent at once (a pipeline, as the full claim). The outcomes of jobs that others wait on
        are left out of it, and applied next in a transaction of their own that settles the
        jobs waiting on them (``job_dependents_cancel`` and ``job_dependents_release``); so is a batch that carries follow-up
        jobs, inserted with it. Zero-row outcomes are replays or stale. ``mark`` (the outbox's
        mark after this batch) is written in the transaction that applies the batch's last part.
        ``timeout_s``: a statement timeout of its own for the batch (one outcome that takes
        longer than --statement-timeout to apply: a fan-out of many follow-ups). ``note_followups``
        is told the ids the follow-ups got before the transaction that inserts them commits (a
        commit whose reply is lost, then replayed, inserts nothing: the ids are known still)."""
        extras = [(o, loads_exact(o.extras_json.decode("utf-8"))) for o in outcomes if o.extras_json]
        if timeout_s is not None or any(o.followups_json for o in outcomes) or any(
                not isinstance(e, dict) or set(e) != {"trace"} for _, e in extras):
            return self._apply_settling(outcomes, steps, mark, timeout_s, note_followups)
        if not outcomes:
            return self._apply_steps(steps, mark)
        runs = [(o.job_id, e["trace"]) for o, e in extras if isinstance(e["trace"], str)]  # traced runs to link
        with self.cursor() as cur, cur.connection.cursor() as stepping, psycopg.RawCursor(cur.connection) as applying:
            conn = cur.connection
            prepare = self.prepares(conn)  # before BEGIN: what it sets is the session's
            if not steps and not runs:  # the apply alone: a transaction of its own
                with refusals(conn):
                    execute_apply(applying, outcomes, prepare=prepare, settles=False, mark=mark, mark_write="if_all")
            else:
                with refusals(conn), conn.pipeline():
                    send_apply(cur, stepping, applying, outcomes, steps, prepare=prepare, settles=False, mark=mark,
                               mark_write="if_all")
                    if runs:  # (a stale attempt's run is kept too: it ran, and a later run may link to it)
                        cur.execute(query("job_trace_runs"), runs_params(runs))
                    cur.execute("COMMIT")
            applied = {(job_id, attempt) for job_id, attempt, _, _ in applying.fetchall()}
            landed = max(0, stepping.rowcount) if steps else 0
        result = ApplyResult(applied=len(applied), steps=landed)
        missed = [o for o in outcomes if (o.job_id, o.attempt) not in applied]
        # Jobs with dependents, or (rarely) replays and stale attempts, which it classifies;
        # the mark was not written (some outcome was not applied): it goes with these.
        return result + self._apply_settling(missed, (), mark) if missed else result

    def _apply_settling(self, outcomes: Sequence[Outcome], steps: Sequence[StepRecord],
                        mark: Mark | None = None, timeout_s: float | None = None,
                        note_followups: NoteFollowups | None = None) -> ApplyResult:
        """``apply_outcomes`` in two round trips: the first sends BEGIN, the steps and the
        outcomes at once; the second settles the jobs waiting on those applied (only when
        some have dependents), inserts the follow-up jobs of those applied as done (only for
        outcomes that carry some), writes ``mark`` and commits.

        A batch applied again after the database went back in time may hold the outcomes
        (and steps) of follow-ups that its own outcomes insert: those jobs did not exist when
        the batch's apply ran, so their steps are recorded once the follow-ups are in, and
        their outcomes are applied next, in a transaction of their own that takes the mark."""
        with self.cursor(timeout_s=timeout_s) as cur, cur.connection.cursor() as stepping, \
                psycopg.RawCursor(cur.connection) as applying:
            conn = cur.connection
            prepare = self.prepares(conn)
            with refusals(conn):
                with conn.pipeline():
                    send_apply(cur, stepping, applying, outcomes, steps, prepare=prepare, settles=True,
                               custom_plans=True, mark=mark, mark_write="never", timeout_s=timeout_s)
                rows = applying.fetchall()
                landed = max(0, stepping.rowcount) if steps else 0
                ended = [(job_id, status) for job_id, _, status, dependents in rows
                         if dependents and status in ("done", "failed", "cancelled")]
                has_followups = any(o.followups_json for o in outcomes)
                # Cancel first: a job also behind a done one stays cancelled.
                if badly := [(i, s) for i, s in ended if s != "done"]:
                    cur.execute(query("job_dependents_cancel"), {"ids": [i for i, _ in badly],
                                                                 "whys": [f"ended {s}" for _, s in badly]})
                if done := [i for i, s in ended if s == "done"]:
                    cur.execute(query("job_dependents_release"), {"ids": done})
                made = insert_followups(cur, outcomes, rows) if has_followups else ()
                apply_extras(cur, outcomes, rows)
                if made and note_followups is not None:
                    note_followups(made)  # before the commit: its reply may be lost, and the ids with it
                followups = sum(i is not None for _, _, ids in made for i in ids)
                applied = {(job_id, attempt) for job_id, attempt, _, _ in rows}
                missed = [o for o in outcomes if (o.job_id, o.attempt) not in applied]
                inserted = {i for _, _, ids in made for i in ids if i is not None}
                again = [o for o in missed if o.job_id in inserted]  # follow-ups' outcomes, in the same batch
                if inserted and (theirs := [s for s in steps if s.job_id in inserted]):
                    cur.execute(query("job_steps_insert"), step_params(theirs))
                    landed += max(0, cur.rowcount)
                    cur.execute(query("job_steps_ahead"), ahead_params(theirs))
                if mark is not None and not again:
                    cur.execute(query("outbox_mark_write"), mark_params(mark))
                cur.execute("COMMIT")
            missed = [o for o in missed if o.job_id not in inserted]
            rows_now: dict[int, JobNow] = {}
            if missed:
                # Rare: a replay after a lost checkpoint, or a stale attempt. The update above is
                # committed, so this reads the state it left.
                cur.execute(query("job_classify"), {"ids": [o.job_id for o in missed]})
                rows_now = {int(i): JobNow(applied, status, attempt, uid)
                            for i, applied, status, attempt, uid in cur.fetchall()}
        result = classify(len(outcomes) - len(missed) - len(again), missed, rows_now, landed, followups, made)
        if again:
            result += self.apply_outcomes(again, (), mark, timeout_s=timeout_s, note_followups=note_followups)
        return self._by_uid(result, missed) if result.missing_ids else result

    def _by_uid(self, result: ApplyResult, missed: Sequence[Outcome]) -> ApplyResult:
        """Outcomes of jobs missing by id that are follow-ups inserted again with another id (the
        database went back in time, and their id went to another job): applied where their uid
        is, their results told by the ids they carry."""
        lost = {o.uid: o for o in missed if o.job_id in set(result.missing_ids) and o.uid is not None}
        if not lost:
            return result
        with self.cursor() as cur:
            cur.execute(query("jobs_reinserted_by_uid"), {"uids": list(lost)})
            found = {int(uid): int(job_id) for uid, job_id in cur.fetchall()}
        if not found:
            return result
        moved = [replace(lost[uid], job_id=job_id) for uid, job_id in found.items()]
        back = {o.job_id: lost[o.uid].job_id for o in moved}
        again = self.apply_outcomes(moved)
        still = {back[i] for i in (*again.missing_ids, *again.late_ids)}
        return ApplyResult(result.applied + again.applied, result.replayed + again.replayed,
                           result.stale + again.stale, result.stale_ids + tuple(back[i] for i in again.stale_ids),
                           tuple(i for i in result.missing_ids if i not in set(back.values()) or i in still),
                           result.steps, result.followups + again.followups,
                           result.cancelled_ids + tuple(back[i] for i in again.cancelled_ids),
                           result.followup_ids + again.followup_ids, result.late_ids)

    def apply_progress(self, progress: Sequence[ProgressRecord]) -> int:
        """Show how far running jobs got (``job.progress``): each job's last value in the
        batch, on the attempt that reported it only, never over a later report; rows changed."""
        with self.cursor() as cur:
            cur.execute(query("job_progress"), {
                "ids": [p.job_id for p in progress], "attempts": [p.attempt for p in progress],
                "uids": [p.uid for p in progress], "values": [p.value_json for p in progress],
                "at": [p.reported_at for p in progress]})
            return max(0, cur.rowcount)

    def _apply_steps(self, steps: Sequence[StepRecord], mark: Mark | None = None) -> ApplyResult:
        """Steps alone: one statement (with ``mark``); a mark alone when there are none."""
        if not steps:
            if mark is not None:
                self.mark_outbox(mark)
            return ApplyResult()
        with self.cursor() as cur, cur.connection.cursor() as stepping:
            conn = cur.connection
            try:
                with conn.pipeline():  # one round trip: BEGIN, the steps, those ahead of their rows, COMMIT
                    cur.execute("BEGIN")
                    stepping.execute(query("job_steps_insert"), step_params(steps, mark))
                    cur.execute(query("job_steps_ahead"), ahead_params(steps))
                    cur.execute("COMMIT")
            except psycopg.Error as exc:
                rollback(conn)
                if not is_refusal(exc):
                    raise
                raise OutcomeRejected(f"outcome rejected: {first_line(exc)}") from exc
            return ApplyResult(steps=max(0, stepping.rowcount))

    def identity(self) -> DatabaseIdentity:
        """(instance id, database name, server as host:port): what an outbox is bound to."""
        with self.cursor() as cur:
            cur.execute(query("db_identity"))
            row = cur.fetchone()
            info = cur.connection.info
        if row is None:
            raise SchemaMissing(f"the {current_schema()}.instance row is missing: run `{migrate_command()}`")
        return DatabaseIdentity(str(row[0]), str(row[1]), f"{info.host}:{info.port}")


def mark_params(mark: Mark | None) -> dict[str, Any]:
    """The parameters that advance an outbox's mark (all NULL: none)."""
    if mark is None:
        return {"mark_outbox": None, "mark_worker": None, "mark_batch": None, "mark_positions": None,
                "mark_expect": None}
    return {"mark_outbox": mark.outbox_id, "mark_worker": mark.worker_id, "mark_batch": mark.batch,
            "mark_positions": mark.positions_json(), "mark_expect": mark.expect}


def outcome_params(outcomes: Sequence[Outcome], *, settles: bool = True, mark: Mark | None = None,
                   mark_write: str = "never") -> dict[str, Any]:
    """``job_apply_outcomes``' arrays (every one in binary: results as bytea, the child's
    JSON bytes unescaped, which the statement turns into jsonb), whether the jobs with
    dependents are applied too (``settles``: their dependents are settled next), and the
    mark to check, and when to write it (``mark_write``: "if_all" the outcomes were applied
    here, "never": the caller writes it later in the same transaction)."""
    return {"settles": settles, "ids": [o.job_id for o in outcomes], "attempts": [o.attempt for o in outcomes],
            "dispositions": [o.disposition.value for o in outcomes], "results": BinaryList(o.result_json for o in outcomes),
            "errors": [o.error for o in outcomes], "delays": [float(o.delay_s) for o in outcomes],
            "tracebacks": [o.traceback for o in outcomes],
            "failed_at": [math.nan if o.failed_at is None else o.failed_at for o in outcomes],
            "uids": [o.uid for o in outcomes], "tokens": [o.token for o in outcomes],
            "errors_kept": ERRORS_KEPT, "error_chars": MAX_ERROR_CHARS, "mark_write": mark_write,
            **mark_params(mark)}


def send_apply(cur: psycopg.Cursor[Any], stepping: psycopg.Cursor[Any], applying: psycopg.RawCursor[Any],
               outcomes: Sequence[Outcome], steps: Sequence[StepRecord], *, prepare: bool, settles: bool,
               custom_plans: bool = False, mark: Mark | None = None, mark_write: str = "never",
               timeout_s: float | None = None) -> None:
    """Into an open pipeline: BEGIN, the steps (on ``stepping``), and the outcomes (on ``applying``,
    with ``mark``). ``custom_plans``: every statement of the transaction planned for its own
    values, as the rare ones that settle dependents and insert follow-ups want (the session's
    plans are generic where the worker prepares: ``shardworker.store.plans``)."""
    cur.execute("BEGIN")
    if custom_plans:
        cur.execute("SET LOCAL plan_cache_mode = force_custom_plan")
    if timeout_s is not None:
        cur.execute("SELECT set_config('statement_timeout', %s, true)", (f"{int(timeout_s * 1000)}ms",))
    if steps:
        stepping.execute(query("job_steps_insert"), step_params(steps))
        cur.execute(query("job_steps_ahead"), ahead_params(steps))
    execute_apply(applying, outcomes, prepare=prepare, settles=settles, mark=mark, mark_write=mark_write)


def execute_apply(applying: psycopg.RawCursor[Any], outcomes: Sequence[Outcome], *, prepare: bool,
                  settles: bool, mark: Mark | None = None, mark_write: str = "never") -> None:
    params = outcome_params(outcomes, settles=settles, mark=mark, mark_write=mark_write)
    applying.execute(native("job_apply_outcomes")[0], native_params("job_apply_outcomes", params), prepare=prepare)


@contextlib.contextmanager
def refusals(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Around an apply's transaction: on an error, roll it back; an error the database would
    repeat (``is_refusal``) or a follow-up refused becomes ``OutcomeRejected``."""
    try:
        yield
    except (psycopg.Error, EnqueueError) as exc:
        rollback(conn)
        if isinstance(exc, psycopg.Error) and not is_refusal(exc):
            raise
        raise OutcomeRejected(f"outcome rejected: {first_line(exc)}") from exc


def ahead_params(steps: Sequence[StepRecord]) -> dict[str, Any]:
    """``job_steps_ahead``'s arrays."""
    return {"job_ids": [s.job_id for s in steps], "attempts": [s.attempt for s in steps], "uids": [s.uid for s in steps]}


def step_params(steps: Sequence[StepRecord], mark: Mark | None = None) -> dict[str, Any]:
    """``job_steps_insert``'s arrays, in binary as ``outcome_params``', and the mark to write."""
    return {"job_ids": [s.job_id for s in steps], "names": [s.name for s in steps],
            "attempts": [s.attempt for s in steps], "results": [s.result_json for s in steps],
            "recorded_at": [s.recorded_at for s in steps], "uids": [s.uid for s in steps], **mark_params(mark)}


FollowupIds = tuple[tuple[int, int, tuple[int | None, ...]], ...]  # (parent id, attempt, the ids its follow-ups got)
NoteFollowups = Callable[[FollowupIds], None]


def insert_followups(cur: psycopg.Cursor[Any], outcomes: Sequence[Outcome],
                     applied: Sequence[tuple[Any, ...]]) -> FollowupIds:
    """Insert the follow-up jobs of the outcomes just applied as done (not those of a replay,
    a stale attempt or a failure), in the apply's transaction; the ids each run's follow-ups
    got (None: a live dedupe key held it). Each follow-up's uid follows from its parent's run;
    an outcome applied again after the database went back in time gives the ids they had
    (``Outcome.followup_ids``)."""
    done = {(job_id, attempt) for job_id, attempt, status, _ in applied if status == "done"}
    rows: list[DependentRow] = []
    runs: list[tuple[int, int, int]] = []  # (parent id, attempt, its follow-ups' count)
    for outcome in outcomes:
        if outcome.followups_json and (outcome.job_id, outcome.attempt) in done:
            offset = len(rows)  # a run's references to its own follow-ups, made batch-wide
            made = followups.decode(outcome.followups_json)
            had = outcome.followup_ids if outcome.followup_ids and len(outcome.followup_ids) == len(made) else None
            again = outcome.reapplied
            rows += [row._replace(after=tuple(ref if ref > 0 else ref - offset for ref in row.after),
                                  id=had[n] if had else None, reinserted=again,
                                  delay_s=max(row.delay_s, outcome.followup_wait_s) if again else row.delay_s,
                                  uid=None if outcome.uid is None else followup_uid(outcome.uid, outcome.attempt, n))
                     for n, row in enumerate(made)]
            runs.append((outcome.job_id, outcome.attempt, len(made)))
    if not rows:
        return ()
    ids = run_plan(cur, plan_insert(rows, refuse_missing=False))
    got: list[tuple[int, int, tuple[int | None, ...]]] = []
    at = 0
    for job_id, attempt, count in runs:
        got.append((job_id, attempt, tuple(ids[at:at + count])))
        at += count
    return tuple(got)


def dumps_text(value: Any) -> str:
    """JSON text for ``Jsonb``: every integer exact (beyond 64 bits too)."""
    return dumps_exact(value).decode("utf-8")


SENDS = (Disposition.DONE, Disposition.SNOOZED, Disposition.SUSPENDED)  # the outcomes whose events are sent


def apply_extras(cur: psycopg.Cursor[Any], outcomes: Sequence[Outcome], applied: Sequence[tuple[Any, ...]]) -> None:
    """In the apply's transaction, for the outcomes just applied (not a replay's, nor a stale
    attempt's): send the events their runs sent when they ended done, snoozed or suspended
    (``shardworker.send_job_event``: each once by its place among its job's sends), then begin
    the waits of the suspended ones (``shardworker.begin_wait``): a wait whose event was sent in
    this same batch sees it; and keep the run spans of those that run again (``job_trace_runs``)."""
    now = {(job_id, attempt): status for job_id, attempt, status, _ in applied}
    sends: list[Any] = []
    waits: list[tuple[int, int, Any]] = []
    runs: list[tuple[int, str]] = []
    for outcome in outcomes:
        if not outcome.extras_json or (outcome.job_id, outcome.attempt) not in now:
            continue
        extras = loads_exact(outcome.extras_json.decode("utf-8"))
        if isinstance(extras.get("trace"), str):  # the run's span, which later runs link to
            runs.append((outcome.job_id, extras["trace"]))
        if outcome.disposition in SENDS:
            sends += [(outcome.job_id, *event) for event in extras.get("events", ())]
        if outcome.disposition is Disposition.SUSPENDED and "wait" in extras:
            waits.append((outcome.job_id, outcome.attempt, extras["wait"]))
    if sends:  # (job id, key, payload, place among the job's sends)
        cur.execute(query("events_send_many"), {"job_ids": [e[0] for e in sends], "idxs": [e[3] for e in sends],
                                                "keys": [e[1] for e in sends],
                                                "payloads": [Jsonb(e[2], dumps=dumps_text) for e in sends]})
    if waits:
        cur.execute(query("job_waits_begin"), {"ids": [w[0] for w in waits], "attempts": [w[1] for w in waits],
                                               "waits": [Jsonb(w[2], dumps=dumps_text) for w in waits]})
    if runs:
        cur.execute(query("job_trace_runs"), runs_params(runs))


def runs_params(runs: Sequence[tuple[int, str]]) -> dict[str, Any]:
    """``job_trace_runs``' arrays: each (job id, its run span's traceparent)."""
    return {"ids": [r[0] for r in runs], "runs": [r[1] for r in runs]}


class JobNow(NamedTuple):
    """A job's row as ``job_classify`` reads it, for an outcome the fenced update did not apply."""

    applied_attempt: int | None
    status: str
    attempt: int
    uid: int | None = None


def classify(applied: int, missed: Sequence[Outcome], rows: dict[int, JobNow],
             steps: int = 0, followups: int = 0, followup_ids: FollowupIds = ()) -> ApplyResult:
    """What became of the outcomes the fenced update did not apply."""
    replayed = 0
    stale: list[int] = []
    missing: list[int] = []
    cancelled: list[int] = []
    late: list[int] = []
    for outcome in missed:
        row = rows.get(outcome.job_id)
        if row is None or (None not in (row.uid, outcome.uid) and row.uid != outcome.uid):
            # No such job here (the wrong database, or deleted), or its id went to another job
            # (the database went back in time and the sequence handed it out again).
            missing.append(outcome.job_id)
        elif (outcome.uid is not None and row.status in ("queued", "waiting", "running")
              and row.attempt < outcome.attempt and (row.applied_attempt or 0) < outcome.attempt):
            # As its claim found it, now: another worker inserted it again (a follow-up the database
            # lost when it went back in time) after this apply looked. Worth another try.
            late.append(outcome.job_id)
        elif row.applied_attempt == outcome.attempt:
            replayed += 1  # this attempt's outcome was applied before: a replay after a lost checkpoint
        elif row.status == "cancelled" and row.attempt == outcome.attempt:
            cancelled.append(outcome.job_id)  # an operator cancelled the job while this attempt ran
        else:
            stale.append(outcome.job_id)  # its attempt was rescued and claimed again
    return ApplyResult(applied, replayed, len(stale), tuple(stale), tuple(missing), steps, followups,
                       tuple(cancelled), followup_ids, tuple(late))
