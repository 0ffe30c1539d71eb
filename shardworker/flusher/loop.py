"""The flusher: drains the outbox into PostgreSQL, batched, fenced, retried forever.

Pure logic over an ``OutboxReader`` and an ``OutcomeStore``; the process around it (and
the parent's handle on that process) is ``shardworker.flusher.process``.

``Flusher.run_once`` reads up to ``flush_batch`` records and ``flush_bytes`` of them (one
bigger record alone), applies them in one fenced statement, and only after the commit marks
them flushed and checkpoints. Step records read with no outcome beside them are held up to
``gather_steps_s`` while more arrive (nobody waits on a step's row: its handler waited on
its fsync), so steps land in transactions of hundreds rather than of a few; an outcome, a
full batch or ``gather = False`` (a stop) applies what is held at once. A worker's flusher
(``lazy_checkpoints``), which outcomes reach a few at a time, catches up after nearly every
batch: then it checkpoints (two fsyncs ahead of the next batch) once nothing more has come
for ``QUIET_CHECKPOINT_S``, every ``checkpoint_interval_s`` while outcomes keep coming, or at
once for a segment to reclaim or a stop. When the database is away, the same batch is
retried with capped, jittered backoff: the flusher never gives up because PostgreSQL is
down. An outcome the database refuses for good is written to ``deadletter/`` and applied as
a failure instead; if even that failure is refused, the job is set aside (one ERROR line,
``stats.refused``) and the batch goes on.

With ``marks`` (``shardworker.flusher.marks``), each batch checks and advances the outbox's
mark in its own transaction; a database found gone back in time (``DatabaseWentBack``) makes
the flusher hold every worker's claims and apply its kept records again from what the
database holds. ``check_wanted`` asks for the same check before the next pass (the worker,
on a new server, waits for it before it claims). An outcome whose job does not
exist is set aside whole (``setaside.jsonl``) and tried again while that may change: often
while some worker re-applies (it may be about to insert the job again: a follow-up the
database lost), now and then for the rest of the reapply window (``shardworker.flusher.setaside``).

A batch that takes longer than the statement timeout to apply (a slow database, a fan-out of
many follow-ups) is applied in halves, then smaller parts, in order; a single record that
still does is given a longer timeout at each try (four times longer, up to
``MAX_STATEMENT_TIMEOUT_S``), each step said in the log: never the same batch forever.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from outbox import OutboxReader, Record
from shardworker.core import layout, wire
from shardworker.core.config import FlusherConfig
from shardworker.core.model import ApplyResult, Mark, Outcome, ProgressRecord, StepRecord
from shardworker.core.retry import Backoff, Outage
from shardworker.errors import DatabaseWentBack, NewerRecord, OutcomeRejected, StatementTimeout, StoreError
from shardworker.flusher import kept
from shardworker.flusher.marks import Marks
from shardworker.flusher.setaside import FAST_S as SETASIDE_FAST_S
from shardworker.flusher.setaside import SLOW_S as SETASIDE_SLOW_S
from shardworker.flusher.setaside import SetAside

log = logging.getLogger(__name__)

QUIET_CHECKPOINT_S = 0.02  # caught up this long with nothing new: the outbox is quiet, checkpoint it
TAIL_LOOK_S = 10.0  # how often an idle flusher checkpoints to let the kept tail go past its window
HOLDS_ASKED_S = 1.0  # how often the database is asked whether some worker holds claims (set-aside outcomes wait)
MAX_STATEMENT_TIMEOUT_S = 3600.0  # the longest a single record's apply is given (its timeout grows 4x a try)
BATCH_BUCKETS = (1, 5, 10, 50, 100, 250, 500, 1000, 5000)  # outcomes per flushed batch, for the metrics


class OutcomeStore(Protocol):
    """What the flusher needs from a store (``PgStore`` provides it)."""
    def apply_outcomes(self, outcomes: Sequence[Outcome], steps: Sequence[StepRecord] = (),
                       mark: Mark | None = None) -> ApplyResult: ...
    def apply_progress(self, progress: Sequence[ProgressRecord]) -> int: ...
    def mark_outbox(self, mark: Mark) -> None: ...


@dataclass
class FlushStats:
    applied: int = 0
    replayed: int = 0
    stale: int = 0
    deadlettered: int = 0
    missing: int = 0  # set aside: their jobs do not exist in this database
    followups: int = 0  # follow-up jobs inserted with their parents' outcomes
    cancelled: int = 0  # kept, not applied: their jobs were cancelled while they ran
    steps: int = 0  # step records flushed (the rest of ``flushed`` are outcomes)
    refused: int = 0  # dead-lettered, and even their failure refused: their jobs left running
    flushed: int = 0  # records marked flushed (applied, replayed, stale, set aside or dead-lettered)
    db_errors: int = 0
    batch_sum: int = 0  # records in every batch flushed, and how many batches per size bucket:
    batch_buckets: list[int] = field(default_factory=lambda: [0] * (len(BATCH_BUCKETS) + 1))
    failing: str = ""  # why the last try failed, while the database is failing; "" once it works
    batch_started_at: float = 0.0  # when the last batch applied began (the flusher's clock)
    regressions: int = 0  # times the database was found gone back in time (shardworker.flusher.marks)

    def batch(self, size: int) -> None:
        self.batch_sum += size
        self.batch_buckets[bisect.bisect_left(BATCH_BUCKETS, size)] += 1


class Flusher:
    """Moves outcomes from an open ``OutboxReader`` into an ``OutcomeStore``."""

    def __init__(self, reader: OutboxReader, store: OutcomeStore, config: FlusherConfig,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 report_outages: bool = True, gather_steps_s: float = 0.0, lazy_checkpoints: bool = False,
                 marks: Marks | None = None) -> None:
        self.reader, self.store, self.config, self.marks = reader, store, config, marks
        self.check_wanted = marks is not None  # check the mark before the next pass (at start: the note may be old)
        self.gather_steps_s, self.lazy_checkpoints = gather_steps_s, lazy_checkpoints
        self.caught_up = False  # the last pass found nothing to apply
        self._caught_up_at: float | None = None  # when a pass first found nothing after the last batch
        self._checkpoint_retry_at = float("-inf")  # after a checkpoint failed, not before this
        self.gather = True  # False: apply held steps at once (the worker stops)
        self._gathering_since: float | None = None  # when the held steps-only batch began to gather
        self.clock, self.sleep = clock, sleep
        # ``report_outages``: whether to log "database unreachable" / "back": not in a worker,
        # whose parent tells of the database for every process at once (shardworker.worker.dbwatch).
        self.outage = Outage("flush", log, Backoff(config.backoff_base_s, config.backoff_cap_s), clock=clock,
                             started="database unreachable ({error}): outcomes wait in the outbox; "
                                     "retrying with backoff",
                             ended="database back after {seconds:.1f}s ({failures} failed flushes); flushing resumed",
                             tell_unreachable=report_outages)
        self.stats = FlushStats()
        self._held: list[Record] = []  # read but not yet applied (kept across failures)
        # each of _held decoded, once (None: dead-lettered)
        self._decoded: list[Outcome | StepRecord | ProgressRecord | None] = []
        self._part: int | None = None  # after a statement timeout: apply only this many of _held at once
        self._timeout_s: float | None = None  # and for a single record, a longer statement timeout
        # Outcomes of jobs missing here, kept in setaside.jsonl and tried again while they may come.
        self.setaside = SetAside(reader.directory, config.reapply_window_s, clock)
        self._holds_asked = (float("-inf"), False)
        self._tail_looked_at = clock()  # when the database was last asked for holds on claims, and its answer
        self._outcomes: list[Outcome] = []  # _held decoded, once: its outcomes
        self._steps: list[StepRecord] = []  # and its step records
        self._last_checkpoint, self._dirty = clock(), False

    @property
    def in_hand(self) -> int:
        """Records read and not yet applied (kept across database failures)."""
        return len(self._held)

    @property
    def idle(self) -> bool:
        """The last pass read and found nothing (a batch ending on a due checkpoint holds nothing, is not dirty, and
        may leave records on disk), the checkpoint is written, and no outcome is held back (``deferred``)."""
        return self.caught_up and not self._held and not self._dirty

    def checkpoint_due_in(self) -> float:
        """Seconds until the checkpoint a caught-up pass put off is due, or held-back outcomes are
        tried again; inf when neither is."""
        due = self._checkpoint_due_in()
        if self.setaside.waiting:
            every = SETASIDE_FAST_S if self.setaside.recent else SETASIDE_SLOW_S
            due = min(due, max(0.0, self.setaside.last + every - self.clock()))
        return due

    def _checkpoint_due_in(self) -> float:
        if not self._dirty:
            return float("inf")
        due = self._last_checkpoint + self.config.checkpoint_interval_s
        if self._caught_up_at is not None:
            due = min(due, self._caught_up_at + QUIET_CHECKPOINT_S)
        return max(0.0, max(due, self._checkpoint_retry_at) - self.clock())

    @property
    def gathering(self) -> bool:
        """Whether step records are held, unapplied, while more gather (poll again soon)."""
        return self._gathering_since is not None

    @property
    def reapplying(self) -> bool:
        """Whether it applies again what the database lost (claims are held meanwhile)."""
        return self.marks is not None and self.marks.reapplying

    def run_once(self) -> int:
        """Apply one batch; returns the records flushed (0 when idle, gathering steps, or the
        database failed)."""
        self.caught_up = False
        if self.marks is not None and not self._keep_marks(self.marks):
            return 0
        if not self._retry_set_aside():
            return 0
        if not self._held or self.gathering:
            self._read()
            if self._gather():
                return 0
        if not self._held:
            self.caught_up, self._caught_up_at = True, self._caught_up_at or self.clock()
            quiet = self.clock() - self._caught_up_at >= QUIET_CHECKPOINT_S
            # A passed seal or empty segment frees space only once a checkpoint deletes it; so does a
            # kept segment past its window, or one the disk wants back, however idle the outbox.
            self._dirty = self._dirty or self.reader.wants_checkpoint or self._tail_due()
            self._maybe_checkpoint(force=not self.lazy_checkpoints or self.reader.wants_checkpoint or not self.gather
                                   or quiet)
            return 0
        started = self.clock()
        count = len(self._held) if self._part is None else min(self._part, len(self._held))
        records, decoded = self._held[:count], self._decoded[:count]
        outcomes = [d for d in decoded if isinstance(d, Outcome)]
        steps = [d for d in decoded if isinstance(d, StepRecord)]
        progress = [d for d in decoded if isinstance(d, ProgressRecord)]
        mark = self.marks.mark_for(records) if self.marks is not None else None
        if self.marks is not None:
            outcomes = self.marks.reapplied(outcomes)
        try:
            if progress:  # first, in a transaction of its own: a replay of it writes the same values
                self.store.apply_progress(progress)
            result = self._apply(outcomes, steps, mark)
        except DatabaseWentBack:
            self._went_back()
            return 0
        except StatementTimeout as exc:
            self._too_slow(count, outcomes, exc)
            return 0
        except StoreError as exc:
            self._failed(exc)
            return 0
        try:
            self._record(result, outcomes)
        except OSError as exc:
            # Stale or set-aside outcomes are kept whole before their records may go: keep
            # the batch (its replay is harmless) until the outbox disk takes them.
            log.error("cannot keep %d stale or set-aside outcomes (%s); retrying",
                      len(result.stale_ids) + len(result.missing_ids), exc)
            self.sleep(self.outage.backoff.next_delay())
            return 0
        self.outage.recovered()
        if self.marks is not None and mark is not None:
            self.marks.applied(mark)
        self.stats.failing, self.stats.batch_started_at = "", started
        self.stats.steps += len(steps)
        flushed = records
        self._held, self._decoded = self._held[count:], self._decoded[count:]
        self._outcomes = [d for d in self._decoded if isinstance(d, Outcome)]
        self._steps = [d for d in self._decoded if isinstance(d, StepRecord)]
        if not self._held and self._part is not None:
            log.info("the slow batch is applied; batches are whole again")
            self._part = self._timeout_s = None
        self._caught_up_at = None
        self.reader.mark_flushed(flushed)
        self.stats.flushed += len(flushed)
        self.stats.batch(len(flushed))
        self._dirty = True
        self._maybe_checkpoint()
        return len(flushed)

    def _tail_due(self) -> bool:
        """Whether to look at the kept tail again (every ``TAIL_LOOK_S``: a checkpoint deletes what
        is past its window, or what the disk wants back)."""
        if self.config.reapply_window_s <= 0 or self.clock() - self._tail_looked_at < TAIL_LOOK_S:
            return False
        self._tail_looked_at = self.clock()
        return True

    def _keep_marks(self, marks: Marks) -> bool:
        """The mark's chores before a pass: the check the worker asked for, and a re-apply's
        hold on claims (moved on, or ended once done). False when the database failed them."""
        try:
            if self.check_wanted:
                marks.check()
                self.check_wanted = False
            marks.progress()
        except DatabaseWentBack:
            self._went_back()
            return False
        except StoreError as exc:
            self._failed(exc)
            return False
        return True

    def _went_back(self) -> None:
        """The database went back in time: drop the records in hand (they come again) and
        re-apply from what it holds, claims held (``Marks.went_back``)."""
        assert self.marks is not None
        self._held, self._decoded, self._outcomes, self._steps, self._gathering_since = [], [], [], [], None
        self._part = self._timeout_s = None
        self.check_wanted = False
        try:
            self.marks.went_back()
        except StoreError as exc:
            self.check_wanted = True  # look again once the database answers
            self._failed(exc)
            return
        self.stats.regressions += 1
        self._dirty = True

    def _too_slow(self, count: int, outcomes: list[Outcome], exc: StoreError) -> None:
        """The batch took longer than the statement timeout: apply it in halves next (in order:
        a prefix of each shard's records), or, a single record, with a longer timeout."""
        self.stats.db_errors += 1
        if count > 1:
            if self._part is None:
                log.warning("a batch of %d records took longer than --statement-timeout to apply (%s): applying it "
                            "in smaller parts", count, exc)
            self._part = max(1, count // 2)
            return
        base = self._timeout_s or self.config.statement_timeout_s
        self._timeout_s = min(MAX_STATEMENT_TIMEOUT_S, base * 4)
        what = (f"the outcome of job {outcomes[0].job_id}" + (" (and its follow-up jobs)" if outcomes[0].followups_json
                                                              else "")) if outcomes else "a batch of step records"
        log.error("%s takes longer than the statement timeout (%.0fs) to apply on this database; trying again with "
                  "%.0fs", what, base, self._timeout_s)

    def _failed(self, exc: StoreError) -> None:
        delay = self.outage.failed(exc)  # raises what is not retryable
        self.stats.db_errors += 1
        # Only an unreachable database is an outage; a conflict or a timeout is retried quietly.
        self.stats.failing = self.outage.unreachable
        self.sleep(delay)

    def _read(self) -> None:
        """Read what fits beside the records held (decoded once)."""
        room = self.config.flush_batch - len(self._held)
        size = sum(len(record.payload) for record in self._held)
        if room <= 0 or (self._held and size >= self.config.flush_bytes):
            return
        records = self.reader.poll(room, self.config.flush_bytes - size if self._held else self.config.flush_bytes)
        self._held += records
        decoded = [self._decode(record) for record in records]
        self._decoded += decoded
        self._outcomes += [d for d in decoded if isinstance(d, Outcome)]
        self._steps += [d for d in decoded if isinstance(d, StepRecord)]

    def _gather(self) -> bool:
        """Whether to hold the records read so far a little longer: steps alone, a batch with
        room left, gathering wanted and for less than ``gather_steps_s``."""
        if (not self.gather or self.gather_steps_s <= 0 or self._outcomes or len(self._held) != len(self._steps)
                or not self._steps or len(self._held) >= self.config.flush_batch):
            self._gathering_since = None
            return False
        now = self.clock()
        if self._gathering_since is None:
            self._gathering_since = now
        if now - self._gathering_since < self.gather_steps_s:
            return True
        self._gathering_since = None
        return False

    def _apply(self, outcomes: list[Outcome], steps: list[StepRecord], mark: Mark | None) -> ApplyResult:
        """Apply the batch with its mark; a job's outcomes one round each (a batch read again
        after the database went back may hold two attempts of one job, applied in order)."""
        rounds = _rounds(outcomes)
        total = ApplyResult()
        for n, part in enumerate(rounds):
            last = n == len(rounds) - 1
            total += self._apply_round(part, steps if n == 0 else [], mark if last else None)
        return total

    def _apply_round(self, outcomes: list[Outcome], steps: list[StepRecord], mark: Mark | None) -> ApplyResult:
        journal = self.marks.journal if self.marks is not None else None
        try:
            if self._timeout_s is not None or (journal is not None and any(o.followups_json for o in outcomes)):
                return self.store.apply_outcomes(outcomes, steps, mark, timeout_s=self._timeout_s,
                                                 note_followups=journal.record if journal is not None else None)
            return self.store.apply_outcomes(outcomes, steps, mark)
        except OutcomeRejected:
            result = self._steps_one_by_one(steps) + self._apply_one_by_one(outcomes)
        if mark is not None:
            self.store.mark_outbox(mark)
        return result

    def _decode(self, record: Record) -> Outcome | StepRecord | ProgressRecord | None:
        try:
            return wire.decode_record(record.payload)
        except NewerRecord as exc:  # a rolled-back release: stop, keep it (dead-lettered, its job would run again)
            raise NewerRecord(f"the outbox {self.reader.directory} holds an outcome written by a newer shardworker "
                              f"({exc}; shard {record.shard}, segment {record.segno}): run that release, or a later "
                              "one, on this outbox to apply it; it is left as it is") from None
        except (ValueError, TypeError) as exc:
            # CRC-valid but not ours: keep the bytes, apply nothing for it.
            name = self._deadletter(record.payload, f"undecodable record: {exc}")
            log.error("outcome dead-lettered to %s/%s: undecodable record: %s", layout.DEADLETTER_DIR, name, exc)
            return None

    def _apply_one_by_one(self, outcomes: list[Outcome]) -> ApplyResult:
        """Isolate the outcomes the database refuses; apply each refusal as a failure."""
        total = ApplyResult()
        for outcome in outcomes:
            try:
                total += self.store.apply_outcomes([outcome])
            except OutcomeRejected as exc:
                total += self._apply_as_failure(outcome, exc)
        return total

    def _steps_one_by_one(self, steps: list[StepRecord]) -> ApplyResult:
        """Isolate the step results the database refuses: each goes to ``deadletter/`` (its
        step will run again on a later attempt; the job's outcome is not touched)."""
        total = ApplyResult()
        for step in steps:
            try:
                total += self.store.apply_outcomes([], [step])
            except OutcomeRejected as exc:
                name = self._deadletter(wire.encode_step(step), str(exc))
                log.error("step %r of job %d dead-lettered to %s/%s: %s", step.name, step.job_id,
                          layout.DEADLETTER_DIR, name, exc)
        return total

    def _apply_as_failure(self, outcome: Outcome, refusal: OutcomeRejected) -> ApplyResult:
        """Keep a refused outcome in ``deadletter/`` (first: it must outlive a crash), then
        fail its job for good with the reason. If the database refuses even that failure,
        the job is set aside: left running, its outcome dead-lettered, counted in
        ``stats.refused``, one ERROR line; the rest of the batch goes on (retrying a
        refusal would only crash-loop the flusher)."""
        name = self._deadletter(wire.encode_outcome(outcome), str(refusal), outcome)
        failure = Outcome.failed(outcome.job_id, outcome.attempt, f"result rejected by the database: {refusal}")
        try:
            result = self.store.apply_outcomes([failure])
        except OutcomeRejected as again:
            self.stats.refused += 1
            log.error("job %d attempt %d set aside, left running: the database refused its outcome (%s) and "
                      "its failure too (%s); the outcome is kept in %s/%s", outcome.job_id, outcome.attempt,
                      refusal, again, layout.DEADLETTER_DIR, name)
            return ApplyResult()
        log.error("outcome dead-lettered to %s/%s: %s", layout.DEADLETTER_DIR, name, refusal)
        return result

    def _deadletter(self, payload: bytes, reason: str, outcome: Outcome | None = None) -> str:
        self.stats.deadlettered += 1
        return kept.deadletter(self.reader.directory, payload, reason, outcome)

    def _record(self, result: ApplyResult, outcomes: list[Outcome] | None = None) -> None:
        outcomes = self._outcomes if outcomes is None else outcomes
        self.stats.applied += result.applied
        self.stats.replayed += result.replayed
        self.stats.stale += result.stale
        self.stats.missing += len(result.missing_ids) + len(result.late_ids)
        self.stats.followups += result.followups
        self.stats.cancelled += len(result.cancelled_ids)
        may_come = bool(result.late_ids) or (bool(result.missing_ids) and self._holds_live())
        kept.keep_unapplied(self.reader.directory, result, outcomes, may_come=may_come)
        if result.missing_ids or result.late_ids:
            self.setaside.kept_more()

    def _holds_live(self) -> bool:
        """Whether a re-apply is under way: this flusher's, or some worker's hold on claims (it
        re-applies, or checks whether it must); its follow-ups may be jobs found missing here.
        The database is asked at most every ``HOLDS_ASKED_S``."""
        if self.marks is None:
            return False
        if self.marks.reapplying:
            return True
        now = self.clock()
        if now - self._holds_asked[0] >= HOLDS_ASKED_S:
            try:
                self._holds_asked = (now, self.marks.others_check())
            except StoreError:
                return True  # as if: the next retry asks again
        return self._holds_asked[1]

    def _apply_set_aside(self, outcomes: list[Outcome]) -> ApplyResult:
        """Set-aside outcomes applied again: those with follow-ups insert them as a re-apply does
        (marked, with the ids they had when known, waiting a while), noted in the journal."""
        journal = self.marks.journal if self.marks is not None else None
        if self.marks is None or journal is None:
            return self.store.apply_outcomes(outcomes)
        return self.store.apply_outcomes(self.marks.reapplied(outcomes, always=True), (), None,
                                         note_followups=journal.record)

    def _retry_set_aside(self) -> bool:
        """The set-aside outcomes, tried again when due (``shardworker.flusher.setaside``); False
        when the database failed it."""
        if not self.setaside.due():
            return True
        try:
            self.setaside.retry(self._apply_set_aside)
        except StoreError as exc:
            self._failed(exc)
            return False
        except OSError as exc:
            log.warning("could not rewrite %s after outcomes set aside there landed (%s); they are tried again",
                        layout.SETASIDE_LOG, exc)
        return True

    def finish(self) -> None:
        """Before the flusher exits: write the checkpoint a caught-up pass put off."""
        self._maybe_checkpoint(final=not self._held)

    def _maybe_checkpoint(self, force: bool = False, final: bool = False) -> None:
        now = self.clock()
        if not self._dirty or (now < self._checkpoint_retry_at and not final):
            return
        if final or force or now - self._last_checkpoint >= self.config.checkpoint_interval_s:
            try:
                if self.marks is not None and self.marks.journal is not None:
                    self.marks.journal.sync()  # the ids follow-ups got: as durable as the positions past them
                self.reader.checkpoint(self.marks.note() if self.marks is not None else None)
            except OSError as exc:
                # Only a hint: a stale checkpoint costs harmless replays, never outcomes. Tried
                # again after the interval, not at every pass (a full disk would spin the loop).
                log.warning("outbox checkpoint not written (%s); will retry", exc)
                self._checkpoint_retry_at = now + self.config.checkpoint_interval_s
                return
            self._last_checkpoint, self._dirty = now, False



def _rounds(outcomes: list[Outcome]) -> list[list[Outcome]]:
    """``outcomes`` in as few rounds as keep each job's outcomes in separate rounds, by attempt
    (one round, nearly always: only a batch read again holds a job twice)."""
    if len({o.job_id for o in outcomes}) == len(outcomes):
        return [outcomes]
    rounds: list[list[Outcome]] = []
    seen: list[set[int]] = []
    for outcome in sorted(outcomes, key=lambda o: (o.job_id, o.attempt)):
        n = next((i for i in range(len(rounds) - 1, -1, -1) if outcome.job_id in seen[i]), -1) + 1
        if n == len(rounds):
            rounds.append([])
            seen.append(set())
        rounds[n].append(outcome)
        seen[n].add(outcome.job_id)
    return rounds
