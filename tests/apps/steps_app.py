"""Handlers made of steps, for the tests of ``job.step``. Each step function appends
"job_id name" to a per-process ledger under $SW_TEST_COUNT_DIR (steps-PID.log) and fsyncs it
before it returns, so a test counts exactly how often each step of each job ran, kills
included; each handler run is counted as the other test apps count theirs (runs-PID.log).

Each step's return is noted too, so a test can tell a step that ran again after it had
returned (a broken promise) from one cut short by a kill before its record was durable (run
again, as promised). The payload steers a run: {"sleep": s} inside each step, and on the first attempt only
{"fail_after": name} (raise once that step returned), {"die_after": name} (SIGKILL the child
once that step returned), {"wait_after": name} (sleep 60 s once that step returned: the test
kills or stops something meanwhile).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

from run_ledger import record

from shardworker import App, Job

app = App()

STEPS = ("fetch", "ocr", "chunk")


def note_step(job_id: int, name: str, event: str = "run") -> None:
    """Append "job_id name event nanoseconds" to this process's step ledger, durably: event
    ``run`` when a step function starts, ``returned`` once ``job.step`` gave its result back."""
    fd = os.open(os.path.join(os.environ["SW_TEST_COUNT_DIR"], f"steps-{os.getpid()}.log"),
                 os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{job_id} {name} {event} {time.time_ns()}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def work(job_id: int, name: str, sleep_s: float) -> str:
    note_step(job_id, name)
    time.sleep(sleep_s)
    return f"{name}-{job_id}"


async def work_async(job_id: int, name: str, sleep_s: float) -> str:
    note_step(job_id, name)
    await asyncio.sleep(sleep_s)
    return f"{name}-{job_id}"


def after_step(job: Job, name: str) -> None:
    """What the payload asks for once step ``name`` returned, on the first attempt."""
    note_step(job.id, name, "returned")
    plan: dict[str, Any] = job.payload or {}
    if job.attempt != 1:
        return
    if plan.get("die_after") == name:
        os.kill(os.getpid(), signal.SIGKILL)
    if plan.get("wait_after") == name:
        time.sleep(60)
    if plan.get("fail_after") == name:
        raise RuntimeError(f"failing after step {name}")


@app.handler("extract", retry_delay=lambda attempt: 0.05)
def extract(job: Job) -> dict[str, Any]:
    record(job)
    sleep_s = float((job.payload or {}).get("sleep", 0))
    results = []
    for name in STEPS:
        results.append(job.step(name, work, job.id, name, sleep_s))
        after_step(job, name)
    return {"id": job.id, "steps": results}


@app.handler("extract_once", max_attempts=1)
def extract_once(job: Job) -> dict[str, Any]:
    return extract(job)


@app.handler("extract_threads", threads=True, retry_delay=lambda attempt: 0.05)
def extract_threads(job: Job) -> dict[str, Any]:
    return extract(job)


@app.handler("agent", retry_delay=lambda attempt: 0.05)
async def agent(job: Job) -> dict[str, Any]:
    record(job)
    sleep_s = float((job.payload or {}).get("sleep", 0))
    results = []
    for name in STEPS:
        results.append(await job.step(name, work_async, job.id, name, sleep_s))
        after_step(job, name)
    return {"id": job.id, "steps": results}
