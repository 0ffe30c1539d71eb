"""Handlers for bench/throughput.py, copied into its work directory and put on PYTHONPATH
(an older shardworker measured for comparison loads the same file)."""
import asyncio
import hashlib
import inspect
import os
import time

from shardworker import App

app = App()
SLEEP_S = float(os.environ.get("BENCH_SLEEP_MS", "20")) / 1000


@app.handler("bench_noop")
def noop(job):
    return None


@app.handler("bench_cpu")
def cpu(job):
    digest = b"x"
    for _ in range(2000):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()[:8]


@app.handler("bench_async")
async def wait_async(job):
    await asyncio.sleep(SLEEP_S)
    return None


# (an older shardworker, measured for comparison, has no threads=)
THREADS = {"threads": True} if "threads" in inspect.signature(app.handler).parameters else {}


@app.handler("bench_threads", **THREADS)
def wait_thread(job):
    time.sleep(SLEEP_S)
    return None


# bench/steps.py: jobs of STEPS no-op steps (job.step) beside no-op jobs, in each handler shape.
STEPS = 10


def nothing():
    return None


async def nothing_async():
    return None


@app.handler("bench_steps")
def steps(job):
    for i in range(STEPS):
        job.step(f"s{i}", nothing)


@app.handler("bench_noop_async")
async def noop_async(job):
    return None


@app.handler("bench_steps_async")
async def steps_async(job):
    for i in range(STEPS):
        await job.step(f"s{i}", nothing_async)


@app.handler("bench_noop_threads", **THREADS)
def noop_threads(job):
    return None


@app.handler("bench_steps_threads", **THREADS)
def steps_threads(job):
    steps(job)


# bench/workflow.py: follow-up jobs (job.enqueue) and jobs that wait on others (after=).


@app.handler("bench_fanout")
def fanout(job):
    """Enqueue payload["n"] no-op follow-ups (each payload["delay_s"] from now, default 0):
    side by side, then one bench_merge after all of them with "merge", or as a chain (each
    after the one before) with "chain"."""
    n, delay_s = job.payload["n"], job.payload.get("delay_s", 0.0)
    if job.payload.get("chain"):
        link = None
        for _ in range(n):
            link = job.enqueue("bench_noop", delay_s=delay_s, after=() if link is None else [link])
        return n
    handles = [job.enqueue("bench_noop", delay_s=delay_s) for _ in range(n)]
    if job.payload.get("merge"):
        job.enqueue("bench_merge", after=handles)
    return n


@app.handler("bench_merge")
def merge(job):
    """How many results it waited on (bench/workflow.py checks it saw them all)."""
    return len(job.dependencies)


# bench/fleet.py: each worker's child appends the ids it runs to its own ledger (BENCH_LEDGER),
# so the bench counts every run of every job, inside the handler.
@app.handler("bench_ledger")
def ledger(job):
    with open(os.environ["BENCH_LEDGER"], "a") as f:
        f.write(f"{job.id}\n")
