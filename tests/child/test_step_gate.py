"""A step not recorded yet runs only while the attempt may start one: not once an operator
cancelled it, and only while the start gate is open (``StartGate``: the parent's
heartbeat says no peer can have rescued this worker's jobs). A handler that began while it
was open and reaches a new step after it closed waits; it runs the step once a beat opens the
gate again, and on a stop it runs nothing: its attempt ends failed, recording nothing. (From a
new user: a worker whose parent was frozen past --rescue-after went on running new steps of a
job that the peer which rescued it was running too.) Real lanes, threads and event loop."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from shardworker.app import App
from shardworker.child.cancels import Cancels, Flag
from shardworker.child.gate import StartGate
from shardworker.child.handlers import attempt_sync
from shardworker.child.hooks import EventLoop, Hooks
from shardworker.child.lanes import AsyncLane, ThreadLane
from shardworker.child.steps import StepLog
from shardworker.core.model import ClaimedJob, Disposition, Outcome
from tests.child.test_start_gate import deadline

app = App()
ran: list[int] = []  # the jobs whose step function ran


def step_fn(job_id: int) -> str:
    ran.append(job_id)
    return "stepped"


cancel_flag = Flag()


@app.handler("cancelled_between", threads=True)
def cancelled_between(job: Any) -> str:
    job.step("a", step_fn, job.id)
    cancel_flag.set()  # an operator's cancel arrives between the steps
    return job.step("b", step_fn, job.id)


@app.handler("sync")
def sync_steps(job: Any) -> str:
    time.sleep(0.4)  # the gate closes meanwhile
    return job.step("s", step_fn, job.id)


@app.handler("async")
async def async_steps(job: Any) -> str:
    await asyncio.sleep(0.4)
    return await job.step("s", step_fn, job.id)


def run_one(kind: str, then: str) -> tuple[Outcome, list[int]]:
    """Start one job of ``kind`` with the gate open for 0.2 s; once its step waits, open the
    gate again (``then="beat"``) or stop the child (``then="stop"``). Its outcome, and what ran."""
    ran.clear()
    alive_until, stopping = deadline(0.2), threading.Event()
    outcomes: list[Outcome] = []
    finished = threading.Event()

    def on_done(_slot: int, _job: ClaimedJob, outcome: Outcome, *_: Any) -> None:
        outcomes.append(outcome)
        finished.set()

    def steps_for(job: ClaimedJob) -> StepLog:
        return StepLog(job, lambda _record, durable: durable(), lambda _record: None, gate=StartGate(alive_until),
                       stopping=stopping.is_set)

    events = EventLoop()
    args = (app, 1, lambda *_: None, on_done, steps_for)
    gate = StartGate(alive_until)
    lane = (ThreadLane(*args, "test", Cancels(), Hooks(app, events), gate) if kind == "sync"
            else AsyncLane(*args, Cancels(), Hooks(app, events), gate))
    try:
        lane.submit([(0, ClaimedJob(7, kind, "default", "null", 1, 3))])
        time.sleep(0.8)
        assert ran == [] and not finished.is_set(), "a new step ran behind a closed gate"
        if then == "beat":
            alive_until[:] = deadline(60)
        else:
            stopping.set()
        assert finished.wait(5)
        lane.stop()
        lane.join(5)
    finally:
        events.stop(5)
    return outcomes[0], list(ran)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_new_step_waits_for_the_gate_and_runs_once_it_opens(kind: str) -> None:
    outcome, stepped = run_one(kind, "beat")
    assert stepped == [7]
    assert outcome.disposition is Disposition.DONE and outcome.result_json == b'"stepped"'


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_stop_while_a_new_step_waits_for_the_gate_runs_nothing_and_charges_nothing(kind: str) -> None:
    """The gate also stays closed through a database outage longer than --rescue-after, with no
    peer rescuing anything: a stop then must not cost the job an attempt (a review point). The
    attempt ends snoozed, due at once: run again from its recorded steps, or stale if rescued."""
    outcome, stepped = run_one(kind, "stop")
    assert stepped == []
    assert outcome.disposition is Disposition.SNOOZED and outcome.delay_s == 0.0, outcome


def test_a_cancelled_attempt_starts_no_new_step() -> None:
    """Cancelled, then retried at once: the cancelled attempt, a sync or threaded handler that
    does not read job.cancelled, went on into its next steps while the retry ran them too, so
    every step ran twice (found by a new user). A new step of a cancelled attempt does not run:
    the attempt ends cancelled (its outcome fenced out), whatever the handler does."""
    ran.clear()
    job = ClaimedJob(9, "cancelled_between", "default", "null", 1, 3)
    attempt = attempt_sync(app, job, StepLog(job, lambda _r, durable: durable(), lambda _r: None), cancel_flag)
    assert ran == [9], "step b ran in an attempt cancelled before it"
    assert attempt.outcome.disposition is Disposition.CANCELLED
