"""The handlers' own count of their runs: each run appends "job_id attempt" to a per-process
file under $SW_TEST_COUNT_DIR and fsyncs it before the handler does anything else, so a run
that was cut short by a kill still counts."""

from __future__ import annotations

import os

from shardworker import Job


def record(job: Job) -> None:
    directory = os.environ["SW_TEST_COUNT_DIR"]
    fd = os.open(os.path.join(directory, f"runs-{os.getpid()}.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{job.id} {job.attempt}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
