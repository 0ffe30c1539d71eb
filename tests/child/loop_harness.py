"""The harness that drives ``ShardRunner`` (the child's loop) in-process: a real shard
writer in a temporary outbox, a real pipe whose other end the test holds (``Parent``),
an injected clock, and a test app whose handlers record what ran."""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from outbox import OutboxReader
from shardworker.app import App
from shardworker.child.main import Progress, ShardRunner, open_writer
from shardworker.core import wire
from shardworker.core.model import ClaimedJob, Job
from tests.clocks import FakeClock as Clock
from tests.helpers import child_config


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
    config = child_config(0, str(tmp_path), delay_s=max_delay_s, records=max_records, concurrency=4, parent_pid=0)
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
    clock = clock or Clock(50.0)
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
