"""Outcomes the parent decides itself, made durable in its own outbox shard.

When a child dies or a handler times out, the started jobs charged for it get a failure
("the handler's process died: exit code 1", "timed out after 30s"), and those whose
handler returned but whose outcome died with the child a snooze (``shardworker.worker.blame``),
that the flusher applies like any other. The parent writes them to shard ``layout.PARENT_SHARD``,
after the step records of those jobs' attempts it ``carry``-s over from the dead child's shard:
in one shard, the flusher lands the steps no later than the outcome that queues the job again,
whichever shard it reaches first. When the outbox cannot take them (a full disk), they wait in
memory and ``flush`` retries; the dispatcher does not claim meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping

from outbox import OutboxError, OutboxSyncError, ShardWriter, WriterConfig
from shardworker.app import HandlerSpec
from shardworker.core import wire
from shardworker.core.jobstats import JobCounts, outcome_label
from shardworker.core.layout import PARENT_SHARD
from shardworker.core.model import ClaimedJob, Outcome
from shardworker.core.retry import job_retry_delay

log = logging.getLogger(__name__)


class ParentOutcomes:
    """The parent's shard writer, opened on first use."""

    def __init__(self, outbox_dir: str, segment_bytes: int, specs: Mapping[str, HandlerSpec],
                 job_counts: JobCounts | None = None) -> None:
        self.outbox_dir, self.segment_bytes, self.specs = outbox_dir, segment_bytes, specs
        self.job_counts = job_counts
        self._writer: ShardWriter | None = None
        self._pending: list[Outcome] = []
        self._carried: list[bytes] = []  # step records, written ahead of the outcomes

    def fail(self, jobs: Iterable[ClaimedJob], reason: str) -> int:
        """Record a failed attempt for each job (retried per its handler's policy); returns how many."""
        jobs, now = list(jobs), time.time()  # when they failed, whenever the database takes them
        outcomes = [Outcome.after_failure(j.id, j.attempt, reason, self._delay(j), failed_at=now).claimed_by(j)
                    for j in jobs]
        if self.job_counts is not None:
            for job, outcome in zip(jobs, outcomes, strict=True):
                self.job_counts.add_outcome(job.kind, outcome_label(job, outcome))
        self._pending.extend(outcomes)
        self.flush()
        return len(outcomes)

    def snooze(self, jobs: Iterable[ClaimedJob]) -> int:
        """Queue each job again at once, using no attempt (its run's outcome was lost with a
        child that something else killed); returns how many."""
        jobs = list(jobs)
        if self.job_counts is not None:
            for job in jobs:
                self.job_counts.add_outcome(job.kind, "snoozed")
        self._pending.extend(Outcome.snoozed(j.id, j.attempt, 0.0).claimed_by(j) for j in jobs)
        self.flush()
        return len(jobs)

    def carry(self, step_records: Iterable[bytes]) -> None:
        """Step records of a dead child's jobs, written before the outcomes that follow."""
        self._carried.extend(step_records)

    def _delay(self, job: ClaimedJob) -> float | None:
        spec = self.specs.get(job.kind)
        return spec.delay_after_failure(job.attempt) if spec else job_retry_delay(job.attempt)

    def waiting_ids(self) -> list[int]:
        return [o.job_id for o in self._pending]

    @property
    def waiting(self) -> int:
        """Outcomes not yet durable (the outbox refused them so far)."""
        return len(self._pending)

    def flush(self) -> bool:
        """Try to make the waiting outcomes durable; True when none waits."""
        if not self._pending and not self._carried:
            if self._writer is not None:
                self._writer.reclaim()  # an applied segment goes once sealed (rate-limited in the writer)
            return True
        try:
            if self._writer is None:
                self._writer = ShardWriter.open(self.outbox_dir, PARENT_SHARD,
                                                WriterConfig(segment_bytes=self.segment_bytes))
            for record in self._carried:
                self._writer.append_bytes(record)
            for outcome in self._pending:
                self._writer.append_bytes(wire.encode_outcome(outcome))
            self._writer.commit()
        except (OutboxError, OSError) as exc:
            log.error("cannot record %d outcomes of dead children yet (%s); retrying", len(self._pending), exc)
            if isinstance(exc, OutboxSyncError):
                self.close()  # fsync failed: that segment is abandoned, the next open starts another
            return False
        self._pending, self._carried = [], []
        return True

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
