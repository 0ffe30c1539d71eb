"""Counts of finished jobs by kind and outcome, with handler durations: summed by a child's
committer thread for each commit (``summarize``), carried to the parent in the ``Done``
message, and added up there (``JobCounts``) for ``shardworker.worker.metrics``. No lock: each side
has one writer."""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from shardworker.core.model import ClaimedJob, Disposition, Outcome

OUTCOMES = ("done", "failed", "retried", "snoozed", "cancelled", "suspended")
# Handler seconds: Prometheus' default buckets, and two more for slow jobs.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0, 60.0)

# Steps (job.step) recorded in the outbox and replayed from earlier attempts: counted in the
# same rows, after the durations, and named in a Stat by these indices past OUTCOMES.
STEP_EVENTS = ("recorded", "replayed")
STEP_RECORDED, STEP_REPLAYED = len(OUTCOMES), len(OUTCOMES) + 1
WIDTH = len(OUTCOMES) + 1 + len(DURATION_BUCKETS) + 1 + len(STEP_EVENTS)
STEPS_AT = WIDTH - len(STEP_EVENTS)  # where a row's step counts start

Stat = tuple[str, int, float]  # (kind, index into OUTCOMES or a STEP_ index, handler seconds; < 0 for none)


def summarize(stats: Iterable[Stat]) -> dict[str, list[float]]:
    """One commit's outcomes, by kind: ``[count per outcome..., seconds sum, count per
    duration bucket (the last: over the largest)..., steps recorded, steps replayed]``
    (only runs with a duration count in the buckets and the sum)."""
    summary: dict[str, list[float]] = {}
    for kind, outcome, seconds in stats:
        row = summary.get(kind)
        if row is None:
            row = summary[kind] = [0] * WIDTH
        if outcome >= len(OUTCOMES):
            row[STEPS_AT + outcome - len(OUTCOMES)] += 1
            continue
        row[outcome] += 1
        if seconds >= 0:
            row[len(OUTCOMES)] += seconds
            row[len(OUTCOMES) + 1 + bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1
    return summary


class JobCounts:
    """The parent's running totals of children's summaries; written by the dispatcher's
    thread only, read by the scrape thread."""

    def __init__(self) -> None:
        self.by_kind: dict[str, list[float]] = {}

    def add(self, summary: dict[str, list[float]]) -> None:
        for kind, row in summary.items():
            total = self.by_kind.get(kind)
            if total is None or len(total) != len(row):
                self.by_kind[kind] = list(row)
            else:
                for i, value in enumerate(row):
                    total[i] += value

    def add_outcome(self, kind: str, outcome: str) -> None:
        """An outcome the parent wrote itself (a failed attempt of a job a dead child lost)."""
        self.add(summarize([(kind, OUTCOMES.index(outcome), -1.0)]))

    def by_outcome(self) -> dict[str, int]:
        """Every kind's outcomes summed, by outcome name."""
        rows = self.snapshot().values()
        return {name: int(sum(row[i] for row in rows)) for i, name in enumerate(OUTCOMES)}

    def steps_recorded(self) -> int:
        """Every kind's steps recorded, summed."""
        return int(sum(row[STEPS_AT] for row in self.by_kind.copy().values() if len(row) == WIDTH))

    def snapshot(self) -> dict[str, list[float]]:
        return {kind: list(row) for kind, row in self.by_kind.copy().items()}


def outcome_label(job: ClaimedJob, outcome: Outcome) -> str:
    """The outcome's name in ``jobstats.OUTCOMES``: a failed attempt is ``retried`` while
    attempts remain (as the job row counts them), else ``failed``."""
    if outcome.disposition is Disposition.RETRY:
        return "retried" if job.attempts_used < job.max_attempts else "failed"
    return outcome.disposition.value
