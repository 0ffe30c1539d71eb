"""shardworker: a PostgreSQL job worker whose finished jobs never run again because the
database was away. See ``App`` for the handler API and ``enqueue`` to add jobs."""

from shardworker.app import App
from shardworker.client import JobSpec, enqueue, enqueue_async, enqueue_many, enqueue_many_async, using_schema
from shardworker.control import Cancel, Fail, Retry, Snooze
from shardworker.core.followups import FollowUp
from shardworker.core.model import Job
from shardworker.core.routing import shard_for
from shardworker.errors import (
    ConfigError,
    DatabaseUnavailable,
    EnqueueError,
    EventError,
    EventTimeout,
    JobsError,
    KindNotServed,
    ShardworkerError,
    StepError,
    StoreError,
    WaitTimeout,
)
from shardworker.events import send_event, send_event_async
from shardworker.jobs import JobInfo, get_job, wait_for, wait_for_async

__all__ = ["App", "Cancel", "ConfigError", "DatabaseUnavailable", "EnqueueError", "EventError", "EventTimeout", "Fail",
           "FollowUp", "Job", "JobInfo", "JobSpec", "JobsError", "KindNotServed", "Retry", "ShardworkerError", "Snooze",
           "StepError", "StoreError", "WaitTimeout", "enqueue", "enqueue_async", "enqueue_many", "enqueue_many_async",
           "get_job", "send_event", "send_event_async", "shard_for", "using_schema", "wait_for", "wait_for_async"]
__version__ = "0.1.0"
