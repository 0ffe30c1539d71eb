"""Handlers that an operator cancels while they run (tests/worker/test_cancel_running.py):
each appends its run to the ledger (tests/apps/run_ledger.py) first, and "job_id how" to the
``stopped-*.log`` ledger when it notices the cancel."""

from __future__ import annotations

import asyncio
import time

from shardworker import App, Job
from tests.apps.run_ledger import append, record

app = App()


@app.handler("async_long")
async def async_long(job: Job) -> str:
    record(job)
    try:
        await asyncio.sleep(float(job.payload.get("sleep", 60)))
    except asyncio.CancelledError:
        append("stopped", f"{job.id} async\n")
        raise
    return "finished"


@app.handler("polite", threads=True)
def polite(job: Job) -> str:
    """Polls job.cancelled; finishes early (returning a result) once it is set. A retry
    takes ``retry_sleep`` (0.3 s by default) instead of ``sleep``."""
    record(job)
    took = job.payload.get("sleep", 60) if job.attempt == 1 else job.payload.get("retry_sleep", 0.3)
    deadline = time.monotonic() + float(took)
    while time.monotonic() < deadline:
        if job.cancelled:
            append("stopped", f"{job.id} polled{'' if job.attempt == 1 else f' attempt {job.attempt}'}\n")
            return "stopped early"
        time.sleep(0.02)
    return "finished"


@app.handler("stubborn")
def stubborn(job: Job) -> str:
    """Never looks at job.cancelled: only its child being stopped ends it early."""
    record(job)
    time.sleep(float(job.payload.get("sleep", 60)))
    append("finished", f"{job.id}\n")
    return "finished"


@app.handler("quick", threads=True)
def quick(job: Job) -> object:
    record(job)
    return job.payload

