"""Handlers for the busy-child tests: one job that holds its child's only lane for a long
time (no timeout), and quick jobs that must not wait behind it. Every run is appended (and
fsync'd) to a per-process ledger under $SW_TEST_COUNT_DIR."""

from __future__ import annotations

import asyncio
import time

from run_ledger import record

from shardworker import App, Job

app = App()


@app.handler("hog")
def hog(job: Job) -> str:
    record(job)
    time.sleep(float((job.payload or {}).get("sleep", 60.0)))
    return "late"


@app.handler("quick")
def quick(job: Job) -> int:
    record(job)
    return job.id


@app.handler("hog_async")
async def hog_async(job: Job) -> str:
    record(job)
    await asyncio.sleep(float((job.payload or {}).get("sleep", 60.0)))
    return "late"


@app.handler("quick_async")
async def quick_async(job: Job) -> int:
    record(job)
    return job.id
