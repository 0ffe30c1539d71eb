"""Handlers for the flow-control tests. Each run appends "kind id attempt start end" (wall
clock seconds) to a per-process ledger under $SW_TEST_COUNT_DIR, fsync'd, so a test can
tell how many ran at once and how many started in any second."""

from __future__ import annotations

import asyncio
import os
import time

from shardworker import App, Job

app = App()


def ledger(job: Job, start: float) -> None:
    line = f"{job.kind} {job.id} {job.attempt} {start:.6f} {time.time():.6f}\n"
    path = os.path.join(os.environ["SW_TEST_COUNT_DIR"], f"ledger-{os.getpid()}.log")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def pause_s(job: Job, default: float) -> float:
    return float((job.payload or {}).get("sleep", default))


@app.handler("api", concurrency=20)
async def api(job: Job) -> None:
    """A slow partner API, capped at 20 in flight per worker."""
    start = time.time()
    await asyncio.sleep(pause_s(job, 1.0))
    ledger(job, start)


@app.handler("thumb")
def thumb(job: Job) -> None:
    """A one-millisecond job."""
    start = time.time()
    time.sleep(0.001)
    ledger(job, start)


@app.handler("limited", global_concurrency=5)
async def limited(job: Job) -> None:
    """At most 5 at once across every worker."""
    start = time.time()
    await asyncio.sleep(pause_s(job, 0.2))
    ledger(job, start)


@app.handler("paced", rate="50/s")
async def paced(job: Job) -> None:
    """At most 50 starts a second across every worker."""
    ledger(job, time.time())


@app.handler("trickle", rate="2/s")
async def trickle(job: Job) -> None:
    """Two starts a second across every worker: a bucket of one token."""
    ledger(job, time.time())
