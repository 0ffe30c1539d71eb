"""A child's lanes start a job they hold only while the gate is open (``StartGate``: the
parent's heartbeat says no peer can have rescued this worker's jobs). Closed, they hold their
jobs unstarted, give them back on a stop, and start them once it opens. Real lanes, threads
and event loop; the shared value is a ctypes double, as the pool makes it."""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any

import pytest

from shardworker.app import App
from shardworker.child.cancels import Cancels
from shardworker.child.hooks import EventLoop, Hooks
from shardworker.child.lanes import AsyncLane, StartGate, ThreadLane
from shardworker.child.steps import StepLog
from shardworker.model import ClaimedJob

app = App()


@app.handler("sync")
def run_sync(job: Any) -> None:
    return None


@app.handler("async")
async def run_async(job: Any) -> None:
    return None


def jobs(kind: str, count: int) -> list[tuple[int, ClaimedJob]]:
    return [(i, ClaimedJob(i + 1, kind, "default", "null", 1, 3)) for i in range(count)]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_closed_gate_starts_nothing_until_it_opens_and_a_stop_returns_what_it_held(kind: str) -> None:
    alive_until = ctypes.c_double(time.monotonic() - 1)  # the heartbeat's last word has run out
    started: list[int] = []
    done = threading.Event()

    def on_start(_slot: int, job: ClaimedJob) -> None:
        started.append(job.id)

    def on_done(*_: Any) -> None:
        if len(started) == 3:
            done.set()

    events = EventLoop()
    hooks, gate = Hooks(app, events), StartGate(alive_until)
    args = (app, 1, on_start, on_done, lambda job: StepLog(job, lambda *_: None, lambda *_: None))
    lane = (ThreadLane(*args, "test", Cancels(), hooks, gate) if kind == "sync"
            else AsyncLane(*args, Cancels(), hooks, gate))
    try:
        lane.submit(jobs(kind, 3))
        time.sleep(0.3)
        assert started == [], "a job started behind a closed gate"
        alive_until.value = time.monotonic() + 60  # a beat found this worker's row: open
        assert done.wait(5), started
        assert started == [1, 2, 3]
        alive_until.value = time.monotonic() - 1
        lane.submit(jobs(kind, 2))
        time.sleep(0.3)
        assert started == [1, 2, 3]
        assert [job.id for _, job in lane.stop()] == [1, 2]  # given back, never started
        lane.join(5)
    finally:
        events.stop(5)
