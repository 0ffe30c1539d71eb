"""Handlers for the tests of tags and bulk actions (tests/client/test_tags.py): one enqueues a
tagged follow-up, one fails with an error that names its payload."""

from __future__ import annotations

from run_ledger import record

from shardworker import App, Fail, Job

app = App()


@app.handler("import")
def import_(job: Job) -> str:
    record(job)
    job.enqueue("notify", {"of": job.id}, tags=["notify", f"customer:{job.payload['customer']}"])
    return "imported"


@app.handler("notify")
def notify(job: Job) -> None:
    record(job)


@app.handler("charge")
def charge(job: Job) -> None:
    record(job)
    raise Fail(f"card declined for {job.payload['who']}")
