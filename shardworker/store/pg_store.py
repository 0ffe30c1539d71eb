"""``PgStore``: the worker's store, every query class on one connection.

Everything outside ``shardworker.store`` talks to it in domain values (``ClaimedJob``,
``Outcome``, ``ApplyResult``, ``WorkerInfo``) and sees ``shardworker.errors`` exceptions
(see ``shardworker.store.connection``). The queries live by concern:

* ``worker_queries``: claim, give back, apply outcomes, requeue;
* ``notifications``: enqueues that wake the worker, and cancels of running jobs;
* ``worker_rows``: heartbeats and the rescue of silent workers;
* ``housekeeping``: counts for metrics, retention, periodic ticks;
* ``schema_queries``: migrations and doctor's probes;
* ``enqueue``: enqueue on the store's connection (``enqueue_async``: on an asyncio one);
* ``job_queries``: operators' reads and changes on the caller's connection or a DSN;
* ``queue_queries``: the backlog by queue and kind, and the queues' state (paused, limits);
* ``serving``: queued kinds no live worker serves;
* ``marks``: how far the database holds what a flusher applied, and the holds on claims.
"""

from __future__ import annotations

from shardworker.core.config import StoreConfig
from shardworker.store.enqueue import EnqueueQueries
from shardworker.store.housekeeping import HousekeepingQueries
from shardworker.store.marks import MarkQueries
from shardworker.store.notifications import Notifications
from shardworker.store.production import ProductionQueries
from shardworker.store.queue_queries import QueueQueries
from shardworker.store.schema_queries import SchemaQueries, ServerState
from shardworker.store.serving import ServingQueries
from shardworker.store.worker_queries import WorkerQueries
from shardworker.store.worker_rows import WorkerRows

__all__ = ["PgStore", "ServerState", "StoreConfig"]


class PgStore(WorkerQueries, Notifications, WorkerRows, HousekeepingQueries, SchemaQueries, EnqueueQueries,
              QueueQueries, ServingQueries, ProductionQueries, MarkQueries):
    """Job storage on one PostgreSQL connection."""
