"""Handlers for the worker tests. Every run appends "job_id attempt" to a per-process file
under $SW_TEST_COUNT_DIR, so a test can count exactly how often each handler ran."""

from __future__ import annotations

import os
import signal
import time

from shardworker import App, Cancel, Fail, Job, Retry, Snooze

app = App()


def record(job: Job) -> None:
    directory = os.environ["SW_TEST_COUNT_DIR"]
    fd = os.open(os.path.join(directory, f"runs-{os.getpid()}.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{job.id} {job.attempt}\n".encode())
    finally:
        os.close(fd)


@app.handler("count")
def count(job: Job) -> dict[str, object]:
    record(job)
    return {"id": job.id, "echo": job.payload}


@app.handler("slow")
def slow(job: Job) -> dict[str, object]:
    record(job)
    time.sleep(float((job.payload or {}).get("sleep", 0.02)))
    return {"id": job.id}


@app.handler("fail", max_attempts=3, retry_delay=lambda attempt: 0.05)
def fail(job: Job) -> None:
    record(job)
    raise ValueError(f"boom on attempt {job.attempt}")


@app.handler("crash_once", retry_delay=lambda attempt: 0.05)
def crash_once(job: Job) -> str:
    record(job)
    if job.attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return "survived"


@app.handler("hang", timeout_s=1.0, retry_delay=lambda attempt: 0.05)
def hang(job: Job) -> str:
    record(job)
    if job.attempt == 1:
        time.sleep(60)
    return "finished"


@app.handler("unserializable")
def unserializable(job: Job) -> object:
    record(job)
    return object()


@app.handler("huge")
def huge(job: Job) -> str:
    record(job)
    return "x" * (65 * 1024 * 1024)


@app.handler("surrogate", max_attempts=2, retry_delay=lambda attempt: 0.05)
def surrogate(job: Job) -> None:
    record(job)
    name = os.fsdecode(b"report-\xff.pdf")  # a file name from os.listdir: holds a lone surrogate
    raise FileNotFoundError(f"cannot open {name}")


@app.handler("nul_error", max_attempts=2, retry_delay=lambda attempt: 0.05)
def nul_error(job: Job) -> None:
    record(job)
    raise ValueError("bad byte \x00 in input")


@app.handler("inf_delay", retry_delay=lambda attempt: float("inf"))
def inf_delay(job: Job) -> None:
    record(job)
    raise ValueError("never retry me")


@app.handler("nan_delay", max_attempts=2, retry_delay=lambda attempt: float("nan"))
def nan_delay(job: Job) -> None:
    record(job)
    raise ValueError("retry me with the default backoff")


@app.handler("nul_result")
def nul_result(job: Job) -> str:
    record(job)
    return "text with \x00 inside"


@app.handler("sleepy")
def sleepy(job: Job) -> dict[str, object]:
    record(job)
    time.sleep(float((job.payload or {}).get("sleep", 1.0)))
    return {"id": job.id}


# Handler control: each records its run, then steers its job with an exception.

@app.handler("retry_twice")
def retry_twice(job: Job) -> int:
    record(job)
    if job.attempt < 3:
        raise Retry("not yet", delay_s=0.05)
    return job.attempt


@app.handler("retry_always", max_attempts=3)
def retry_always(job: Job) -> None:
    record(job)
    raise Retry(delay_s=0)


@app.handler("snooze_once")
def snooze_once(job: Job) -> int:
    record(job)
    if job.attempt == 1:
        raise Snooze(delay_s=0.05)
    return job.attempt


@app.handler("snooze_async")
async def snooze_async(job: Job) -> int:
    record(job)
    if job.attempt == 1:
        raise Snooze(0.05)
    return job.attempt


@app.handler("fail_now")
def fail_now(job: Job) -> None:
    record(job)
    raise Fail("card declined")


@app.handler("cancel_me", threads=True)
def cancel_me(job: Job) -> None:
    record(job)
    raise Cancel("order withdrawn")


@app.handler("fail_retry_in_2s", max_attempts=2, retry_delay=lambda attempt: 2.0)
def fail_retry_in_2s(job: Job) -> None:
    record(job)
    raise ValueError(f"boom on attempt {job.attempt}")


@app.handler("fail_retry_in_1h", max_attempts=2, retry_delay=lambda attempt: 3600.0)
def fail_retry_in_1h(job: Job) -> None:
    record(job)
    raise ValueError(f"boom on attempt {job.attempt}")
