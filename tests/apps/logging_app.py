"""A handler that logs on its own logger and on a chatty library's (as an HTTP client logs each
request at INFO): tests/worker/test_log_levels.py reads what the worker's log shows."""

from __future__ import annotations

import logging

from shardworker import App, Job

app = App()
log = logging.getLogger(__name__)
library = logging.getLogger("httpx")  # as httpx logs each request at INFO


@app.handler("fetch")
def fetch(job: Job) -> None:
    library.info("HTTP Request: GET https://example.com/%d", job.id)
    library.warning("retrying a slow request for job %d", job.id)
    log.info("fetched for job %d", job.id)
    logging.getLogger("billing.tasks").info("a module of another package, job %d", job.id)
