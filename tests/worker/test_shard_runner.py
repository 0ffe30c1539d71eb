"""``ShardRunner`` (the child's loop) driven in-process: a real shard writer in a temporary
outbox, a real pipe whose other end the test holds, an injected clock. No processes."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import multiprocess
import pytest

from outbox import OutboxReader
from shardworker import wire
from shardworker.app import App
from shardworker.model import ClaimedJob, Job
from shardworker.shard import ChildConfig, Progress, ShardRunner, open_writer


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


def start_runner(tmp_path: Path, app: App, clock: Clock, *, max_records: int = 512,
                 max_delay_s: float = 0.005) -> tuple[Any, threading.Thread, Any, Progress]:
    """The loop on a thread, as in a child; returns (the parent's pipe end, thread, writer, progress)."""
    config = ChildConfig(0, str(tmp_path), "unused", max_delay_s, max_records, 1 << 20, 0)
    parent, child = multiprocess.Pipe(duplex=True)
    progress = Progress([0] * Progress.WIDTH)
    writer = open_writer(config)
    runner = ShardRunner(config, app, writer, child, progress, clock=clock)
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
        parent.send_bytes(wire.encode(wire.Jobs(tuple(jobs))))
        messages = receive_until(parent, len(jobs))
        parent.send_bytes(wire.encode(wire.Stop()))
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
    assert [(o.job_id, o.ok) for o in stored] == [(1, True), (2, True), (3, False)]
    assert stored[2].retry_delay_s == 7.0 and "ValueError: no luck" in (stored[2].error or "")
    assert progress.started == 3 and progress.job_id == 0  # three started, none running now


def test_group_commit_is_bounded_by_record_count(tmp_path: Path) -> None:
    """With max_records 2, five fast outcomes go out in commits of 2, 2 and 1."""
    messages, _, _ = run_child(tmp_path, [job(i) for i in range(1, 6)], max_records=2, max_delay_s=60)
    assert [len(m.finished) for m in messages if isinstance(m, wire.Done)] == [2, 2, 1]


def test_a_slow_handler_commits_at_once(tmp_path: Path) -> None:
    """An outcome that took longer than the commit delay is committed without waiting for more."""
    messages, _, _ = run_child(tmp_path, [job(1, "slow"), job(2, "slow"), job(3)], max_records=100,
                               max_delay_s=0.5)
    assert [m.finished for m in messages if isinstance(m, wire.Done)] == [((1, 1),), ((2, 1),), ((3, 1),)]


def test_stop_reports_the_jobs_never_started(tmp_path: Path) -> None:
    """A stop request finishes the job in hand and reports the rest as never started."""
    clock = Clock()
    ran: list[int] = []
    app = make_app(clock, ran)
    holder: list[Any] = []
    spec = app.handlers["ok"]

    def stop_during_first(j: Job) -> Any:
        holder[0].send_bytes(wire.encode(wire.Stop()))
        return spec.fn(j)

    app.handlers["ok"] = replace(spec, fn=stop_during_first)
    parent, thread, writer, _ = start_runner(tmp_path, app, clock)
    holder.append(parent)
    try:
        parent.send_bytes(wire.encode(wire.Jobs((job(1), job(2), job(3)))))
        thread.join(10)
        messages = [wire.decode(parent.recv_bytes()) for _ in range(2)]
    finally:
        writer.close()
    assert ran == [1]
    assert messages == [wire.Done(((1, 1),)), wire.Stopped(((2, 1), (3, 1)))]


@pytest.mark.parametrize("kind", ["ok", "boom"])
def test_progress_names_the_running_job(tmp_path: Path, kind: str) -> None:
    """While a handler runs, progress holds its id and how many jobs started; after, no job."""
    seen: list[tuple[int, int]] = []
    clock = Clock()
    app = make_app(clock, [])
    spec = app.handlers[kind]
    box: list[Progress] = []

    def watching(j: Job) -> Any:
        seen.append((box[0].job_id, box[0].started))
        return spec.fn(j)

    app.handlers[kind] = replace(spec, fn=watching)
    parent, thread, writer, progress = start_runner(tmp_path, app, clock)
    box.append(progress)
    try:
        parent.send_bytes(wire.encode(wire.Jobs((job(40, "ok"), job(41, kind)))))
        receive_until(parent, 2)
        parent.send_bytes(wire.encode(wire.Stop()))
        thread.join(10)
    finally:
        writer.close()
    assert seen[-1] == (41, 2)
    assert progress.job_id == 0
