"""Jobs whose inputs are large (tests/worker/test_large_inputs.py): one that records five
steps of 55 MB and fails its first attempt, producers of 55 MB results, a merge after
them, and quick jobs behind them. Each run is counted (``run_ledger``)."""

from __future__ import annotations

from run_ledger import record

from shardworker import App, Job

app = App()

PART_BYTES = 55_000_000


@app.handler("big_steps", max_attempts=3)
def big_steps(job: Job) -> int:
    record(job)
    parts = [job.step(f"part{i}", lambda i=i: chr(ord("a") + i) * PART_BYTES) for i in range(5)]
    if job.attempt == 1:
        raise RuntimeError("fails once its steps are recorded")
    return sum(len(part) for part in parts)


@app.handler("produce", max_attempts=1)
def produce(job: Job) -> str:
    record(job)
    return "y" * PART_BYTES


@app.handler("merge", max_attempts=1)
def merge(job: Job) -> int:
    record(job)
    return sum(len(result) for result in job.dependencies.values())


@app.handler("quick", max_attempts=1)
def quick(job: Job) -> str:
    record(job)
    return "done"
