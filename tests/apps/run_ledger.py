"""The handlers' own count of their runs: each run appends "job_id attempt" to a per-process
file under $SW_TEST_COUNT_DIR and fsyncs it before the handler does anything else, so a run
that was cut short by a kill still counts."""

from __future__ import annotations

import os

from shardworker import Job


def record(job: Job) -> None:
    append("runs", f"{job.id} {job.attempt}\n")


def append(prefix: str, line: str) -> None:
    """Append ``line`` to this process's ``<prefix>-<pid>.log`` under $SW_TEST_COUNT_DIR, durably."""
    path = os.path.join(os.environ["SW_TEST_COUNT_DIR"], f"{prefix}-{os.getpid()}.log")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
