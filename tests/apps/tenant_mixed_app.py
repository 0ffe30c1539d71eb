"""A mixed workload for the tests of keys beside other scheduling: ``render`` jobs carry a
tenant's key (at most 2 of one tenant at once), ``partner`` calls are a slow kind capped at 2
across workers, and ``thumb`` is a fast kind of its own queue. Each run appends
"start|end KIND KEY ID ATTEMPT T" to a per-process ledger under $SW_TEST_COUNT_DIR, fsync'd,
and counts itself (runs-PID.log)."""

from __future__ import annotations

import asyncio
import time

from run_ledger import append, record

from shardworker import App, Job

app = App()


async def _timed(job: Job, sleep_s: float) -> None:
    record(job)
    append("mixed", f"start {job.kind} {job.key} {job.id} {job.attempt} {time.time():.6f}\n")
    await asyncio.sleep(sleep_s)
    append("mixed", f"end {job.kind} {job.key} {job.id} {job.attempt} {time.time():.6f}\n")


@app.handler("render", key_concurrency=2)
async def render(job: Job) -> None:
    await _timed(job, 0.2)


@app.handler("partner", global_concurrency=2)
async def partner(job: Job) -> None:
    await _timed(job, 1.0)


@app.handler("thumb")
async def thumb(job: Job) -> None:
    await _timed(job, 0.001)
