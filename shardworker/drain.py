"""``outbox drain``: apply every pending outcome of an outbox directory, then stop.

It refuses while a worker (or another drain) holds the directory, waits out an
unreachable database up to a timeout, and works on a directory copied from a dead host:
shards without a live writer are recovered (torn tails cut, segments sealed) and read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from outbox import OutboxLocked
from outbox import status as outbox_status
from shardworker.errors import DrainTimeout, OutboxBusy
from shardworker.flusher import Flusher, FlusherConfig, FlushStats
from shardworker.flusher_process import open_reader
from shardworker.layout import lock_outbox
from shardworker.pg_store import PgStore, StoreConfig


def drain(outbox_dir: str, dsn: str, *, timeout_s: float, backoff_cap_s: float = 5.0,
          progress: Callable[[FlushStats, int], None] | None = None) -> FlushStats:
    """Apply everything pending; raise ``DrainTimeout`` if outcomes remain at the deadline."""
    if not os.path.isdir(outbox_dir):
        raise OutboxBusy(f"no outbox directory at {outbox_dir}")
    lock_fd = lock_outbox(outbox_dir)
    try:
        try:
            reader = open_reader(outbox_dir, wait_s=0)
        except OutboxLocked as exc:
            raise OutboxBusy(f"a flusher holds the outbox {outbox_dir}") from exc
        store = PgStore(StoreConfig(dsn))
        deadline = time.monotonic() + timeout_s

        def sleep(seconds: float) -> None:
            time.sleep(max(0.0, min(seconds, deadline - time.monotonic())))

        flusher = Flusher(reader, store, FlusherConfig(backoff_cap_s=backoff_cap_s,
                                                       backoff_base_s=min(0.05, backoff_cap_s)), sleep=sleep)
        try:
            return _drain_loop(flusher, outbox_dir, deadline, progress)
        finally:
            store.close()
            reader.close()
    finally:
        os.close(lock_fd)


def _drain_loop(flusher: Flusher, outbox_dir: str, deadline: float,
                progress: Callable[[FlushStats, int], None] | None) -> FlushStats:
    while True:
        flusher.run_once()
        if progress:
            progress(flusher.stats, flusher.in_hand)
        if flusher.idle:
            return flusher.stats
        if time.monotonic() >= deadline:
            pending = outbox_status(outbox_dir).pending
            raise DrainTimeout(f"{pending} outcomes still pending after the timeout "
                               f"({flusher.stats.db_errors} database errors); run drain again")
