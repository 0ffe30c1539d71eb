"""Handlers for the concurrency tests: async, threaded and plain sync kinds in one app. Every
run is appended (and fsync'd) to a per-process ledger under $SW_TEST_COUNT_DIR; the capped
kind also records how many of its handlers run at once, across all processes."""

from __future__ import annotations

import asyncio
import fcntl
import os
import time

from run_ledger import record

from shardworker import App, Job

app = App()


def sleep_s(job: Job, default: float) -> float:
    return float((job.payload or {}).get("sleep", default))


@app.handler("wait_async")
async def wait_async(job: Job) -> dict[str, object]:
    record(job)
    await asyncio.sleep(sleep_s(job, 0.02))
    return {"id": job.id, "lane": "async"}


@app.handler("wait_thread", threads=True)
def wait_thread(job: Job) -> dict[str, object]:
    record(job)
    time.sleep(sleep_s(job, 0.02))
    return {"id": job.id, "lane": "threads"}


@app.handler("wait_release")
async def wait_release(job: Job) -> dict[str, object]:
    """Waits until the file ``release`` appears in $SW_TEST_COUNT_DIR (a minute at most)."""
    record(job)
    release = os.path.join(os.environ["SW_TEST_COUNT_DIR"], "release")
    deadline = time.monotonic() + 60
    while not os.path.exists(release) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return {"id": job.id, "lane": "async"}


@app.handler("cpu")
def cpu(job: Job) -> dict[str, object]:
    record(job)
    return {"id": job.id, "lane": "sync"}


@app.handler("async_timeout", timeout_s=0.5, max_attempts=1)
async def async_timeout(job: Job) -> str:
    record(job)
    await asyncio.sleep(sleep_s(job, 0.0))
    return "in time"


def _in_flight(delta: int) -> None:
    """Add ``delta`` to the capped kind's in-flight count; keep the highest seen (a locked file)."""
    path = os.path.join(os.environ["SW_TEST_COUNT_DIR"], "capped.count")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        now, peak = (int(x) for x in (os.pread(fd, 64, 0).decode() or "0 0").split())
        now += delta
        os.pwrite(fd, f"{now} {max(peak, now)}".ljust(64).encode(), 0)
    finally:
        os.close(fd)


@app.handler("capped", concurrency=3)
async def capped(job: Job) -> str:
    record(job)
    _in_flight(+1)
    try:
        await asyncio.sleep(0.1)
    finally:
        _in_flight(-1)
    return "ok"
