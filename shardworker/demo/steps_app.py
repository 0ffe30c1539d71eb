"""The handler of ``shardworker demo --steps``: a job of four steps, in an app of its own (a
threaded kind in the other demos' app would change how their workers hand out jobs)."""

from __future__ import annotations

import random
import time

from shardworker import App, Job
from shardworker.demo.app import note

app = App()

STEPS = ("fetch", "parse", "enrich", "store")
STEP_S = 0.1


@app.handler("demo.steps", threads=True, max_attempts=5)
def steps(job: Job) -> dict[str, object]:
    """Four steps of about a tenth of a second each, counted from inside (``shardworker demo
    --steps``): "run JOB ATTEMPT" for each handler run, "step JOB ATTEMPT NAME" when a step's
    function returns, "replay JOB ATTEMPT NAME" when ``job.step`` gave a step's recorded
    result back without calling it."""
    note(f"run {job.id} {job.attempt}")
    value = job.payload["n"]
    for name in STEPS:
        called: list[bool] = []
        value = job.step(name, demo_step, job.id, job.attempt, name, value, called)
        if not called:
            note(f"replay {job.id} {job.attempt} {name}")
    return {"n": job.payload["n"], "value": value}


def demo_step(job_id: int, attempt: int, name: str, value: int, called: list[bool]) -> int:
    """One step of ``demo.steps``: a little work, then its ledger line; ``called`` tells the
    handler the function ran. The work takes 0.5 to 1.5 times ``STEP_S``, so a child's threads
    drift apart rather than all finishing their steps at one moment."""
    time.sleep(random.uniform(0.5, 1.5) * STEP_S)
    note(f"step {job_id} {attempt} {name}")
    called.append(True)
    return value + 1
