"""The shop's jobs (tests/apps/shop_web.py): a receipt that reports its progress and returns."""

from __future__ import annotations

import time

from run_ledger import record

from shardworker import App, Job

app = App()


@app.handler("receipt")
def receipt(job: Job) -> dict[str, object]:
    record(job)
    for page in range(1, 4):
        job.progress({"page": page, "of": 3})
        time.sleep(0.3)
    return {"sent_to": job.payload["email"]}
