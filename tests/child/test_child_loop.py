"""``ShardRunner`` (the child's loop) driven in-process: outcomes durable before they are
reported, group commits, and the progress and per-kind summaries it reports. The harness
is in loop_harness.py; stop and recall are in test_child_stop_recall.py."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from shardworker.child.main import Progress
from shardworker.core import wire
from shardworker.core.jobstats import DURATION_BUCKETS, OUTCOMES, STEPS_AT, JobCounts
from shardworker.core.model import Disposition, Job
from tests.child.loop_harness import Clock, job, jobs_msg, make_app, outcomes, receive_until, run_child, start_runner

DONE = Disposition.DONE


def test_every_outcome_is_durable_before_it_is_reported(tmp_path: Path) -> None:
    """Each job's outcome is in the shard, and Done names it only after its commit."""
    messages, ran, progress = run_child(tmp_path, [job(1), job(2), job(3, "boom")])
    assert ran == [1, 2, 3]
    done = [key for m in messages if isinstance(m, wire.Done) for key in m.finished]
    assert done == [(1, 1), (2, 1), (3, 1)]
    stored = outcomes(tmp_path)
    assert [(o.job_id, o.disposition) for o in stored] == [(1, DONE), (2, DONE), (3, Disposition.RETRY)]
    assert stored[2].delay_s == 7.0 and "ValueError: no luck" in (stored[2].error or "")
    # Each job's slot says it started, and that it no longer runs.
    assert all(progress.started(slot, job_id) for slot, job_id in enumerate([1, 2, 3]))
    assert all(progress.running_since(slot, job_id) is None for slot, job_id in enumerate([1, 2, 3]))


def test_group_commit_is_bounded_by_record_count(tmp_path: Path) -> None:
    """With max_records 2, five fast outcomes go out in commits of 2, 2 and 1."""
    messages, _, _ = run_child(tmp_path, [job(i) for i in range(1, 6)], max_records=2, max_delay_s=60)
    assert [len(m.finished) for m in messages if isinstance(m, wire.Done)] == [2, 2, 1]


def test_a_finished_outcome_is_committed_while_a_slow_handler_runs(tmp_path: Path) -> None:
    """The commit deadline holds while the next handler runs: a fast job's outcome is durable and
    reported while a slow one still blocks (a kill then would not re-run the fast job)."""
    release = threading.Event()
    app = make_app(Clock(50.0), [])

    @app.handler("block")
    def block(job: Job) -> str:
        assert release.wait(30)
        return "late"

    parent, thread, writer, _ = start_runner(tmp_path, app, time.monotonic, max_records=100, max_delay_s=0.05)
    try:
        parent.send(jobs_msg(job(1), job(2, "block")))
        assert [m.finished for m in receive_until(parent, 1)] == [((1, 1),)]
        assert [o.job_id for o in outcomes(tmp_path)] == [1]  # durable before it was reported
        release.set()
        assert [m.finished for m in receive_until(parent, 1)] == [((2, 1),)]
        parent.send(wire.Stop())
        thread.join(10)
    finally:
        release.set()
        writer.close()


def test_each_report_carries_its_outcomes_by_kind_for_the_metrics(tmp_path: Path) -> None:
    """The Done of a commit sums its outcomes per kind (done, retried, failed for good) and
    their handler seconds; the parent's JobCounts adds the summaries up."""
    messages, _, _ = run_child(tmp_path, [job(1), job(2), job(3, "boom"), job(4, "boom", attempt=25)],
                               max_records=100, max_delay_s=60)
    counts = JobCounts()
    for msg in messages:
        assert isinstance(msg, wire.Done) and msg.stats is not None
        counts.add(msg.stats)
    rows = counts.snapshot()
    assert sorted(rows) == ["boom", "ok"]
    by_outcome = {kind: dict(zip(OUTCOMES, row, strict=False)) for kind, row in rows.items()}
    assert by_outcome["ok"] == {"done": 2, "failed": 0, "retried": 0, "snoozed": 0, "cancelled": 0, "suspended": 0}
    assert by_outcome["boom"] == {"done": 0, "failed": 1, "retried": 1, "snoozed": 0, "cancelled": 0, "suspended": 0}
    # Every run lands in exactly one duration bucket; the seconds are real and small.
    buckets = rows["ok"][len(OUTCOMES) + 1:STEPS_AT]
    assert len(buckets) == len(DURATION_BUCKETS) + 1 and sum(buckets) == 2
    assert 0 <= rows["ok"][len(OUTCOMES)] < 1.0


@pytest.mark.parametrize("kind", ["ok", "boom"])
def test_progress_names_the_running_job(tmp_path: Path, kind: str) -> None:
    """While a handler runs, its slot says so (with its start on the monotonic clock); after, it
    says started and finished."""
    seen: list[float | None] = []
    clock = Clock(50.0)
    app = make_app(clock, [])
    spec = app.handlers[kind]
    box: list[Progress] = []

    def watching(j: Job) -> Any:
        seen.append(box[0].running_since(1, 41) if j.id == 41 else None)
        return spec.fn(j)

    app.handlers[kind] = replace(spec, fn=watching)
    parent, thread, writer, progress = start_runner(tmp_path, app, clock)
    box.append(progress)
    before = time.monotonic()
    try:
        parent.send(jobs_msg(job(40, "ok"), job(41, kind)))
        receive_until(parent, 2)
        parent.send(wire.Stop())
        thread.join(10)
    finally:
        writer.close()
    started = seen[-1]
    assert started is not None and before - 0.01 <= started <= time.monotonic()
    assert progress.started(1, 41) and progress.running_since(1, 41) is None
