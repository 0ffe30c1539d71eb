"""The demo's handlers: small CPU work, a little sleep, and an occasional flaky failure; and
``note``, the ledger the demos that stop PostgreSQL count runs in."""

from __future__ import annotations

import hashlib
import os
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
    """Fail about a third of first attempts, on purpose; retries succeed."""
    if job.attempt == 1 and random.random() < 0.33:
        raise RuntimeError("simulated flaky dependency (planned: the retry succeeds)")
    time.sleep(0.001)
    return {"attempt": job.attempt}


@app.handler("demo.outage", max_attempts=3)
def outage(job: Job) -> dict[str, object]:
    """A few milliseconds of work, counted from inside: one line "JOB ATTEMPT" per run in the
    ledger (``shardworker demo --outage`` counts re-runs there)."""
    time.sleep(0.004)
    note(f"{job.id} {job.attempt}")
    return {"n": job.payload["n"]}


def note(line: str) -> None:
    """Append ``line`` to this process's ledger under $SHARDWORKER_DEMO_LEDGER and fsync it,
    so the demo counts every run, kill -9 and power loss included."""
    path = os.path.join(os.environ["SHARDWORKER_DEMO_LEDGER"], f"runs-{os.getpid()}.log")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
