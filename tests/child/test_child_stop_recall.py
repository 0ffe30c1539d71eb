"""``ShardRunner`` (the child's loop) driven in-process, handing work back: a stop reports
the jobs never started, and a recall returns those queued behind busy handlers."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from shardworker.core import wire
from shardworker.core.model import Job
from tests.child.loop_harness import Clock, job, jobs_msg, make_app, receive_until, start_runner


def test_stop_reports_the_jobs_never_started(tmp_path: Path) -> None:
    """A stop request finishes the job in hand and reports the rest as never started."""
    clock = Clock(50.0)
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


@pytest.mark.parametrize("lane", ["sync", "async"])
def test_a_recall_returns_the_jobs_not_started_and_they_never_run_here(tmp_path: Path, lane: str) -> None:
    """While every handler of a lane is busy, a Recall gives back the jobs queued behind them
    (Returned, in order); those never run in this child, and the busy ones still report."""
    release = threading.Event()
    ran: list[int] = []
    app = make_app(Clock(50.0), ran)

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
