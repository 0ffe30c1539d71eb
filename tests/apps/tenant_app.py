"""A web app's per-tenant work for the tests of keys: ``render`` jobs carry the tenant as
their key, and at most 2 of one tenant's run at once across every worker. Each run appends
"start KEY ID ATTEMPT T" when it begins and "end KEY ID ATTEMPT T" when it ends (wall clock
seconds) to a per-process ledger under $SW_TEST_COUNT_DIR, fsync'd, and counts itself as the
other test apps do (runs-PID.log), so a test tells how many of a tenant's ran at once, kills
included."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from run_ledger import append, record

from shardworker import App, Job

app = App()


@app.handler("render", key_concurrency=2, retry_delay=lambda attempt: 0.05)
async def render(job: Job) -> dict[str, Any]:
    record(job)
    append("tenants", f"start {job.key} {job.id} {job.attempt} {time.time():.6f}\n")
    await asyncio.sleep(float((job.payload or {}).get("sleep", 0.2)))
    append("tenants", f"end {job.key} {job.id} {job.attempt} {time.time():.6f}\n")
    return {"id": job.id}
