"""The demo's handlers: small CPU work, a little sleep, and an occasional flaky failure."""

from __future__ import annotations

import hashlib
import random
import time

from shardworker import App, Job

app = App()


@app.handler("demo.hash", max_attempts=3)
def hash_payload(job: Job) -> dict[str, object]:
    """Hash the payload's text a few hundred times."""
    digest = str(job.payload).encode()
    for _ in range(200):
        digest = hashlib.sha256(digest).digest()
    return {"sha256": digest.hex()[:16]}


@app.handler("demo.flaky", max_attempts=3, retry_delay=lambda attempt: 0.2 * attempt)
def flaky(job: Job) -> dict[str, object]:
    """Fail about a third of first attempts; retries succeed."""
    if job.attempt == 1 and random.random() < 0.33:
        raise RuntimeError("simulated flaky dependency")
    time.sleep(0.001)
    return {"attempt": job.attempt}
