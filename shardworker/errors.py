"""Errors of shardworker.

Hierarchy::

    ShardworkerError                  one-line message; the CLI prints it and exits 1
    ├── ConfigError                   an option or setting is invalid
    ├── AppLoadError                  --app cannot be imported or holds no App
    ├── EnqueueError                  a job (or a line of a bulk file) is invalid
    │   └── KindNotServed             strict: no live worker handles that kind in that queue
    ├── EventError                    an event's key or payload is invalid (send_event, job.wait_event)
    ├── JobsError                     an operator command refused (unknown id, wrong state, bad input)
    │   └── WaitTimeout               wait_for ran out of time before the job ended
    ├── OutboxBusy                    a worker or another drain holds the outbox directory
    ├── DrainTimeout                  outcomes remained when --timeout ran out
    ├── CrashLoop                     a child or the flusher keeps dying right after start
    │   └── StartupFailed             a child's on_startup hook raised: the worker stops at start
    ├── NewerRecord                   an outbox record of a newer release: left on disk, the flusher
    │                                 stops (also a ValueError)
    ├── WorkerIdInUse                 another live worker runs under this --worker-id
    ├── WorkerRescued                 a peer rescued this worker's jobs while it was silent
    └── StoreError                    PostgreSQL said no (translated from psycopg)
        ├── DatabaseUnavailable       cannot connect or the connection broke: retry slowly
        │   └── NotConnected          no connection opened: nothing reached the server
        ├── TransientConflict         serialization failure, deadlock, cancelled statement: retry fast
        │   └── StatementTimeout      a statement ran past --statement-timeout
        ├── SchemaMissing             the schema is missing or older than the code
        ├── DatabaseWentBack          the database holds less than this outbox saw committed (a
        │                             failover to a replica that lagged, a restore): re-apply
        ├── Reconnected               a claim found a connection newer than the worker's last look
        └── DataRejected              the database refuses this data for good: a value over an
            │                         index's limit (class 54), bad data (class 22), a check
            │                         (23514); never retried, never told as an outage
            └── OutcomeRejected       the database refuses an outcome for good (bad data)

    StepError                         job.step misused: the attempt fails, even when the handler
                                      catches it, and nothing of the step is recorded
    EventTimeout                      job.wait_event's timeout passed before its event came (also
                                      a TimeoutError); every later run of the job gets it again

Each class's docstring is its default message.
"""

from __future__ import annotations


class ShardworkerError(Exception):
    """shardworker error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigError(ShardworkerError):
    """Invalid configuration."""


class AppLoadError(ShardworkerError):
    """Cannot load the application."""


class EnqueueError(ShardworkerError):
    """Invalid job."""


class KindNotServed(EnqueueError):
    """No live worker handles this kind in this queue (``enqueue(..., strict=True)``)."""


class EventError(ShardworkerError):
    """An event's key or payload is invalid."""


class JobsError(ShardworkerError):
    """An operator command refused (unknown id, a job in the wrong state, bad input)."""


class WaitTimeout(JobsError, TimeoutError):
    """The job did not end in time."""


class OutboxBusy(ShardworkerError):
    """A worker or another drain holds this outbox directory."""


class DrainTimeout(ShardworkerError):
    """Outcomes remain in the outbox after the timeout."""


class CrashLoop(ShardworkerError):
    """A worker process keeps dying right after it starts."""


class StartupFailed(CrashLoop):
    """A child's on_startup hook raised; the worker stops instead of restarting it."""


class NewerRecord(ShardworkerError, ValueError):
    """An outbox record written by a newer shardworker, in a format this one cannot read (a
    deploy rolled back while outcomes waited). The flusher leaves it on disk and stops: never
    dead-lettered, or its job would be requeued and its handler run again. A ``ValueError``
    for the readers that only skip what they cannot read."""


class WorkerIdInUse(ShardworkerError):
    """Another live worker runs under this worker id: give each worker its own --worker-id."""


class WorkerRescued(ShardworkerError):
    """A peer rescued this worker's jobs while it was silent (paused, or cut off, for longer than
    --rescue-after): the jobs it holds run elsewhere now."""


class StoreError(ShardworkerError):
    """The database refused the operation."""


class DatabaseUnavailable(StoreError):
    """The database is unreachable."""


class NotConnected(DatabaseUnavailable):
    """No connection could be opened: nothing of the operation reached the server."""


class TransientConflict(StoreError):
    """The database gave up on the statement for now (serialization failure, deadlock, timeout)."""


class StatementTimeout(TransientConflict):
    """A statement ran past its statement timeout (--statement-timeout)."""


class SchemaMissing(StoreError):
    """The shardworker schema is missing or out of date: run `shardworker migrate`."""


class DatabaseWentBack(StoreError):
    """The database holds less than this outbox's flusher saw it commit: it went back in time."""


class Reconnected(StoreError):
    """The connection is new since the worker last looked at the database: claim after a look."""


class DataRejected(StoreError):
    """The database refuses this data for good (too big for an index, invalid, out of range)."""


class OutcomeRejected(DataRejected):
    """The database rejected an outcome for good."""


class StepError(Exception):
    """A step was misused (``job.step``); the attempt fails (even when the handler catches
    this) and nothing of the step is recorded."""


class EventTimeout(TimeoutError):
    """No event came for a ``job.wait_event`` before its timeout; recorded like a step, so every
    later run of the job gets this again at that wait."""
