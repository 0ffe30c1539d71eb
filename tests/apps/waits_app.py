"""Handlers that sleep, wait for events, send them and report progress, for the tests of durable
waits (``tests/waits``). Every handler run is counted (runs-PID.log, ``run_ledger``) and every
step run too, in the step ledger's format (steps-PID.log: "job_id name run|returned ns"), so a
test tells a step that ran twice from one replayed."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from run_ledger import append, record

from shardworker import App, EventTimeout, Job

app = App()


def step(job: Job, name: str, seconds: float = 0.0) -> Any:
    """A step (taking ``seconds``) that notes its runs and its return in the ledger."""
    def work() -> str:
        append("steps", f"{job.id} {name} run {time.time_ns()}\n")
        time.sleep(seconds)
        return f"{name}-{job.id}"
    value = job.step(name, work)
    append("steps", f"{job.id} {name} returned {time.time_ns()}\n")
    return value


@app.handler("nap", max_attempts=3)
def nap(job: Job) -> dict[str, Any]:
    """Steps (for ``payload["step_s"]``), sleeps ``payload["sleep"]`` seconds, steps again."""
    record(job)
    before = step(job, "before", (job.payload or {}).get("step_s", 0.0))
    job.sleep("nap", (job.payload or {}).get("sleep", 5))
    append("woke", f"{job.id} {time.time()}\n")
    after = step(job, "after")
    return {"before": before, "after": after}


@app.handler("nap-async")
async def nap_async(job: Job) -> dict[str, Any]:
    record(job)
    before = await job.step("before", lambda: f"before-{job.id}")
    await job.sleep("nap", (job.payload or {}).get("sleep", 1))
    await asyncio.sleep(0)
    return {"before": before, "woke": True}


@app.handler("approval")
def approval(job: Job) -> dict[str, Any]:
    """Drafts, waits for ``approve:<order>`` (at most ``payload["timeout"]`` seconds), ships."""
    record(job)
    plan = job.payload or {}
    step(job, "draft")
    try:
        decision = job.wait_event("approval", f"approve:{plan['order']}", timeout_s=plan.get("timeout"))
    except EventTimeout:
        return {"timed_out": True}
    step(job, "ship")
    return {"decision": decision}


@app.handler("notifier")
def notifier(job: Job) -> str:
    """Sends ``payload["payload"]`` to ``payload["key"]`` with its outcome."""
    record(job)
    job.send_event(job.payload["key"], job.payload.get("payload"))
    return "sent"


@app.handler("reporter")
def reporter(job: Job) -> int:
    """Reports progress ``payload["steps"]`` times, ``payload["every"]`` seconds apart."""
    record(job)
    plan = job.payload or {}
    total = plan.get("steps", 10)
    for n in range(1, total + 1):
        job.progress({"done": n, "of": total})
        time.sleep(plan.get("every", 0.0))
    return total


@app.handler("fast")
def fast(job: Job) -> int:
    record(job)
    return job.id
