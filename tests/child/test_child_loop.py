"""``ShardRunner`` (the child's loop) driven in-process: a real shard writer in a temporary
outbox, a real pipe whose other end the test holds, an injected clock. No processes."""

from __future__ import annotations

import asyncio
import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from outbox import OutboxReader
from shardworker import wire
from shardworker.app import App
from shardworker.child.main import ChildConfig, Progress, ShardRunner, open_writer
from shardworker.jobstats import DURATION_BUCKETS, OUTCOMES, JobCounts
from shardworker.model import ClaimedJob, Disposition, Job

DONE = Disposition.DONE


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def make_app(clock: Clock, ran: list[int]) -> App:
    app = App()

    @app.handler("ok")
    def ok(job: Job) -> dict[str, int]:
        ran.append(job.id)
        return {"id": job.id}

    @app.handler("slow")
    def slow(job: Job) -> str:
        ran.append(job.id)
        clock.now += 1.0  # a second passes while it runs
        return "slow"

    @app.handler("boom", retry_delay=lambda attempt: 7.0)
    def boom(job: Job) -> None:
        ran.append(job.id)
        raise ValueError("no luck")

    return app


def job(job_id: int, kind: str = "ok", attempt: int = 1) -> ClaimedJob:
    return ClaimedJob(job_id, kind, "default", "null", attempt, 25)


class Parent:
    """The parent's ends of the two pipes."""

    def __init__(self) -> None:
        self.to_child_r, self.to_child_w = os.pipe()
        self.from_child_r, self.from_child_w = os.pipe()
        self.slot = 0

    def send(self, msg: wire.Message) -> None:
        if isinstance(msg, wire.Jobs) and not msg.slots:
            msg = wire.Jobs(msg.jobs, tuple(range(self.slot, self.slot + len(msg.jobs))))
            self.slot += len(msg.jobs)
        wire.write_frame(self.to_child_w, msg)

    def poll(self, timeout_s: float) -> bool:
        return bool(select.select([self.from_child_r], [], [], timeout_s)[0])

    def recv_bytes(self) -> bytes:
        msg = wire.read_frame(self.from_child_r)
        assert msg is not None
        return wire.encode(msg)


def jobs_msg(*jobs: ClaimedJob) -> wire.Jobs:
    return wire.Jobs(tuple(jobs), ())  # slots are given by Parent.send_bytes


def start_runner(tmp_path: Path, app: App, clock: Callable[[], float], *, max_records: int = 512,
                 max_delay_s: float = 0.005) -> tuple[Parent, threading.Thread, Any, Progress]:
    """The loop on a thread, as in a child; returns (the parent's side, thread, writer, progress)."""
    config = ChildConfig(0, str(tmp_path), "unused", max_delay_s, max_records, 1 << 20, 0, 4, 64)
    parent = Parent()
    progress = Progress([0] * Progress.width(64), 64)
    writer = open_writer(config)
    runner = ShardRunner(config, app, writer, parent.to_child_r, parent.from_child_w, progress)
    runner.committer.clock = clock
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    return parent, thread, writer, progress


def receive_until(parent: Any, done: int) -> list[wire.Message]:
    """Messages until ``done`` jobs were reported (fails after 10 s)."""
    messages: list[wire.Message] = []
    while sum(len(m.finished) for m in messages if isinstance(m, wire.Done)) < done:
        assert parent.poll(10), f"only {messages} after 10 s"
        messages.append(wire.decode(parent.recv_bytes()))
    return messages


def run_child(tmp_path: Path, jobs: list[ClaimedJob], *, max_records: int = 512, max_delay_s: float = 0.005,
              clock: Clock | None = None) -> tuple[list[wire.Message], list[int], Progress]:
    """Send ``jobs`` at once, wait for all to be reported, then stop; returns (messages, runs, progress)."""
    clock = clock or Clock()
    ran: list[int] = []
    parent, thread, writer, progress = start_runner(tmp_path, make_app(clock, ran), clock, max_records=max_records,
                                                    max_delay_s=max_delay_s)
    try:
        parent.send(jobs_msg(*jobs))
        messages = receive_until(parent, len(jobs))
        parent.send(wire.Stop())
        thread.join(10)
        assert not thread.is_alive()
        assert wire.decode(parent.recv_bytes()) == wire.Stopped(())
    finally:
        writer.close()
    return messages, ran, progress


def outcomes(directory: Path) -> list[Any]:
    with OutboxReader.open(str(directory)) as reader:
        return [wire.decode_outcome(r.payload) for r in reader.poll(1000)]


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
    app = make_app(Clock(), [])

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


def test_stop_reports_the_jobs_never_started(tmp_path: Path) -> None:
    """A stop request finishes the job in hand and reports the rest as never started."""
    clock = Clock()
    ran: list[int] = []
    app = make_app(clock, ran)
    holder: list[Any] = []
    spec = app.handlers["ok"]

    def stop_during_first(j: Job) -> Any:
        holder[0].send(wire.Stop())
        time.sleep(0.5)  # the child's main thread reads the stop meanwhile
        return spec.fn(j)

    app.handlers["ok"] = replace(spec, fn=stop_during_first)
    parent, thread, writer, _ = start_runner(tmp_path, app, clock)
    holder.append(parent)
    try:
        parent.send(jobs_msg(job(1), job(2), job(3)))
        thread.join(10)
        messages = [wire.decode(parent.recv_bytes()) for _ in range(2)]
    finally:
        writer.close()
    assert ran == [1]
    assert isinstance(messages[0], wire.Done) and messages[0].finished == ((1, 1),)
    assert messages[1] == wire.Stopped(((2, 1), (3, 1)))


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
    assert by_outcome["ok"] == {"done": 2, "failed": 0, "retried": 0, "snoozed": 0, "cancelled": 0}
    assert by_outcome["boom"] == {"done": 0, "failed": 1, "retried": 1, "snoozed": 0, "cancelled": 0}
    # Every run lands in exactly one duration bucket; the seconds are real and small.
    buckets = rows["ok"][len(OUTCOMES) + 1:]
    assert len(buckets) == len(DURATION_BUCKETS) + 1 and sum(buckets) == 2
    assert 0 <= rows["ok"][len(OUTCOMES)] < 1.0


@pytest.mark.parametrize("kind", ["ok", "boom"])
def test_progress_names_the_running_job(tmp_path: Path, kind: str) -> None:
    """While a handler runs, its slot says so (with its start on the monotonic clock); after, it
    says started and finished."""
    seen: list[float | None] = []
    clock = Clock()
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


@pytest.mark.parametrize("lane", ["sync", "async"])
def test_a_recall_returns_the_jobs_not_started_and_they_never_run_here(tmp_path: Path, lane: str) -> None:
    """While every handler of a lane is busy, a Recall gives back the jobs queued behind them
    (Returned, in order); those never run in this child, and the busy ones still report."""
    release = threading.Event()
    ran: list[int] = []
    app = make_app(Clock(), ran)

    if lane == "sync":
        @app.handler("block")
        def block(job: Job) -> str:
            ran.append(job.id)
            assert release.wait(30)
            return "late"

        busy, kinds = 1, ("block", "ok")
    else:
        @app.handler("block_async")
        async def block_async(job: Job) -> str:
            ran.append(job.id)
            while not release.is_set():
                await asyncio.sleep(0.01)
            return "late"

        @app.handler("ok_async")
        async def ok_async(job: Job) -> int:
            ran.append(job.id)
            return job.id

        busy, kinds = 4, ("block_async", "ok_async")  # the runner's concurrency is 4
    parent, thread, writer, progress = start_runner(tmp_path, app, time.monotonic)
    try:
        parent.send(jobs_msg(*[job(i, kinds[0]) for i in range(1, busy + 1)], job(10, kinds[1]), job(11, kinds[1])))
        deadline = time.monotonic() + 10
        while not all(progress.started(slot, slot + 1) for slot in range(busy)):
            assert time.monotonic() < deadline, "the blocking handlers never started"
            time.sleep(0.01)
        parent.send(wire.Recall())
        assert parent.poll(10)
        assert wire.decode(parent.recv_bytes()) == wire.Returned(((10, 1), (11, 1)))
        release.set()
        finished = [key for m in receive_until(parent, busy) if isinstance(m, wire.Done) for key in m.finished]
        assert sorted(finished) == [(i, 1) for i in range(1, busy + 1)]
        parent.send(wire.Stop())
        thread.join(10)
        assert wire.decode(parent.recv_bytes()) == wire.Stopped(())
    finally:
        release.set()
        writer.close()
    assert sorted(ran) == list(range(1, busy + 1))
