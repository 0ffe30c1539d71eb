"""The parent's store and what uses it besides the dispatcher (the watch for unserved kinds,
the housekeeping), made once the children are forked: importing the store brings psycopg and
what it imports, about 13 MB that a child forked after it would hold and never use. Nothing
here connects yet."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple

from shardworker.app import App
from shardworker.core.config import WorkerConfig
from shardworker.core.retry import Backoff
from shardworker.store.pg_store import PgStore
from shardworker.worker.housekeeping import BACKLOG_INTERVAL_S, Housekeeper
from shardworker.worker.unserved import UnservedWatch


class ParentStores(NamedTuple):
    new_store: Callable[[], PgStore]  # another store on its own connection (the heartbeat's)
    store: PgStore  # the dispatcher's and the start's
    unserved: UnservedWatch
    housekeeper: Housekeeper


def open_stores(config: WorkerConfig, app: App) -> ParentStores:
    store_config = config.store_config()

    def new_store() -> PgStore:
        return PgStore(store_config)

    # Its checks on short-lived connections with a short statement timeout: on millions of
    # queued rows one is worth skipping, not waiting for.
    unserved = UnservedWatch(lambda: PgStore(replace(store_config, statement_timeout_s=2.0)), app.kinds,
                             config.queues)
    housekeeper = Housekeeper(new_store(), list(app.schedules.values()), config.retention_s,
                              Backoff(config.backoff_base_s, config.backoff_cap_s),
                              retention_failed_s=config.failed_retention_s, prune_interval_s=config.prune_interval_s,
                              forget_schedules_s=config.periodic_forget_s, event_retention_s=config.event_retention_s,
                              backlog_interval_s=None if config.metrics_port is None else BACKLOG_INTERVAL_S,
                              unserved=unserved)
    return ParentStores(new_store, new_store(), unserved, housekeeper)
