"""Handlers that kill their own child process or never return, beside well-behaved ones, for
the tests of who is charged when a child dies. Every run is appended (and fsync'd) to a
per-process ledger under $SW_TEST_COUNT_DIR before the handler does anything else."""

from __future__ import annotations

import asyncio
import ctypes
import os
import time

from run_ledger import record

from shardworker import App, Job

app = App()


def sleep_s(job: Job, default: float) -> float:
    return float((job.payload or {}).get("sleep", default))


def quick_retry(attempt: int) -> float:
    return 0.05


@app.handler("ok")
def ok(job: Job) -> dict[str, object]:
    record(job)
    time.sleep(sleep_s(job, 0.0))
    return {"id": job.id}


@app.handler("exit1", max_attempts=2, retry_delay=quick_retry)
def exit1(job: Job) -> None:
    record(job)
    os._exit(1)


@app.handler("segv", max_attempts=2, retry_delay=quick_retry)
def segv(job: Job) -> None:
    record(job)
    ctypes.string_at(0)  # reads address 0: SIGSEGV


@app.handler("thread_ok", threads=True)
def thread_ok(job: Job) -> dict[str, object]:
    record(job)
    time.sleep(sleep_s(job, 0.0))
    return {"id": job.id}


@app.handler("thread_hang", threads=True, timeout_s=2, max_attempts=1)
def thread_hang(job: Job) -> None:
    record(job)
    time.sleep(3600)


@app.handler("async_ok")
async def async_ok(job: Job) -> dict[str, object]:
    record(job)
    await asyncio.sleep(sleep_s(job, 0.0))
    return {"id": job.id}


@app.handler("async_exit", max_attempts=2, retry_delay=quick_retry)
async def async_exit(job: Job) -> None:
    record(job)
    await asyncio.sleep(sleep_s(job, 0.3))  # its neighbours start meanwhile
    os._exit(1)


@app.handler("async_block", timeout_s=1, max_attempts=1)
async def async_block(job: Job) -> None:
    record(job)
    await asyncio.sleep(sleep_s(job, 0.3))  # its neighbours start meanwhile
    time.sleep(3600)  # blocks the event loop: only the parent's kill ends it


@app.handler("forever", max_attempts=1)
def forever(job: Job) -> None:
    record(job)
    time.sleep(3600)


@app.handler("patient", timeout_s=60)
def patient(job: Job) -> dict[str, object]:
    record(job)
    time.sleep(sleep_s(job, 3.0))
    return {"id": job.id}
