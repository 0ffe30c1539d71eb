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
from shardworker.child.gate import StartGate
from shardworker.child.hooks import EventLoop, Hooks
from shardworker.child.lanes import AsyncLane, ThreadLane
from shardworker.child.steps import StepLog
from shardworker.core import procs
from shardworker.core.model import ClaimedJob

app = App()


@app.handler("sync")
def run_sync(job: Any) -> None:
    return None


@app.handler("async")
async def run_async(job: Any) -> None:
    if job.payload == "block":
        time.sleep(0.5)  # a sync call in an async handler: it holds the loop, as a freeze would


def deadline(in_s: float) -> Any:
    """The pool's shared pair, as the heartbeat sets it: boot-time and wall-clock deadlines."""
    return (ctypes.c_double * 2)(procs.boottime() + in_s, time.time() + in_s)


def jobs(kind: str, count: int) -> list[tuple[int, ClaimedJob]]:
    return [(i, ClaimedJob(i + 1, kind, "default", "null", 1, 3)) for i in range(count)]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_closed_gate_starts_nothing_until_it_opens_and_a_stop_returns_what_it_held(kind: str) -> None:
    alive_until = deadline(-1)  # the heartbeat's last word has run out
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
        alive_until[:] = deadline(60)  # a beat found this worker's row: open
        assert done.wait(5), started
        assert started == [1, 2, 3]
        alive_until[:] = deadline(-1)
        lane.submit(jobs(kind, 2))
        time.sleep(0.3)
        assert started == [1, 2, 3]
        assert [job.id for _, job in lane.stop()] == [1, 2]  # given back, never started
        lane.join(5)
    finally:
        events.stop(5)


def test_an_async_job_whose_task_was_made_before_the_gate_closed_does_not_start() -> None:
    """The async lane makes a task per job that fits; a handler blocking the loop delays those
    tasks, and the gate may close meanwhile: each task looks at the gate again before its
    handler starts, and gives its job back to the waiting ones. (From a review: jobs 2 and 3
    started behind a closed gate.)"""
    alive_until = deadline(60)
    gate = StartGate(alive_until)
    started: list[tuple[int, bool]] = []
    events = EventLoop()
    lane = AsyncLane(app, 3, lambda _slot, job: started.append((job.id, gate.open())), lambda *_: None,
                     lambda job: StepLog(job, lambda *_: None, lambda *_: None), Cancels(), Hooks(app, events), gate)
    try:
        blocker = ClaimedJob(1, "async", "default", '"block"', 1, 3)
        lane.submit([(0, blocker), *jobs("async", 3)[1:]])
        time.sleep(0.1)
        alive_until[:] = deadline(-1)  # closes while job 1 holds the loop
        time.sleep(1.0)
        assert started == [(1, True)], started
        assert sorted(job.id for _, job in lane.stop()) == [2, 3]
        lane.join(5)
    finally:
        events.stop(5)


def test_the_wall_clock_closes_the_gate_when_the_boot_clock_did_not_see_a_pause() -> None:
    """A VM paused by its hypervisor may keep its clocks still; the wall clock, set right by NTP
    or the guest agent on resume, then says the time that passed: either deadline closes it."""
    until = deadline(60)
    gate = StartGate(until)
    assert gate.open()
    until[1] = time.time() - 1  # the wall clock jumped past the deadline on resume
    assert not gate.open()
