"""Helpers for testing code built on shardworker (docs/testing.md#testing-your-handlers).

* ``run_handler`` (and ``run_handler_async``): run a handler on a job in-process, without a
  worker or a database, on the child's own code; ``HandlerRun`` says how it ended.
* ``record_enqueued``: a context manager that records the jobs enqueued while it is open, read
  from the jobs table of a real PostgreSQL, with helpers to pick them by kind, queue and payload.

Test-side code: it may import the store (this package never runs in a worker's child).
"""

from shardworker.testing.enqueued import Enqueued, record_enqueued
from shardworker.testing.handlers import FollowUpJob, HandlerFailed, HandlerRun, run_handler, run_handler_async

__all__ = ["Enqueued", "FollowUpJob", "HandlerFailed", "HandlerRun", "record_enqueued", "run_handler",
           "run_handler_async"]
