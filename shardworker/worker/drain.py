"""``outbox drain``: apply every pending outcome of an outbox directory, then stop.

It refuses while a worker (or another drain) holds the directory, refuses a database the
outbox does not belong to (``shardworker.core.binding``), waits out an unreachable database up
to a timeout, and works on a directory copied from a dead host: shards without a live
writer are recovered (torn tails cut, segments sealed) and read. While it drains it
heartbeats for the worker whose outbox this is, so no peer rescues (and re-runs) jobs whose
outcomes it is applying; like a worker, it first makes sure no live worker uses that id.
Once every outcome is applied, it settles what the owner's last run left, as the owner's
next start would (``shardworker.worker.recovery``: the jobs its stop could not give back,
then its running jobs with no outcome); then its heartbeat row goes. It is a worker's
start without children and without claims, so it lives with the worker and drives the
flusher's loop (``shardworker.flusher``) in this process.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from typing import TypeVar

from outbox import OutboxLocked, is_locked
from outbox import status as outbox_status
from shardworker.core import binding, layout
from shardworker.core.config import StoreConfig, WorkerConfig
from shardworker.core.retry import Backoff, retry_call
from shardworker.errors import DrainTimeout, OutboxBusy, StoreError
from shardworker.flusher.loop import Flusher, FlushStats
from shardworker.flusher.process import marks_for, open_reader
from shardworker.store.pg_store import PgStore
from shardworker.worker import identity, recovery, started
from shardworker.worker.heartbeat import Heartbeat

log = logging.getLogger(__name__)

T = TypeVar("T")

ORPHANED = "worker stopped while the job was running (requeued by outbox drain)"
HEARTBEAT_INTERVAL_S = 2.0  # a worker's default (WorkerConfig.heartbeat_interval_s): what a peer expects


def drain(outbox_dir: str, dsn: str, *, timeout_s: float, backoff_cap_s: float = 5.0,
          progress: Callable[[FlushStats, int], None] | None = None, reapply: bool = False,
          from_start: bool = False, role: str = "drain") -> FlushStats:
    """Apply everything pending; raise ``DrainTimeout`` if outcomes remain at the deadline.
    ``reapply`` (``outbox reapply``): first apply again the kept records past the database's
    mark (``from_start``: every kept record), as a worker does when it finds the database
    went back in time, whatever the marks say."""
    if not os.path.lexists(outbox_dir):
        raise OutboxBusy(f"no outbox directory at {outbox_dir}")
    lock_fd = layout.lock_outbox(outbox_dir, role)  # refuses another user's directory, or a symlink
    try:
        # The worker's defaults, with the caller's backoff cap (a drain by hand may want a short one).
        config = WorkerConfig(dsn=dsn, app_ref="", backoff_cap_s=backoff_cap_s, backoff_base_s=min(0.05, backoff_cap_s))
        try:
            reader = open_reader(outbox_dir, wait_s=0, keep=config.flusher_config().keep())
        except OutboxLocked as exc:
            raise OutboxBusy(f"a flusher holds the outbox {outbox_dir}") from exc
        store = PgStore(config.store_config())
        deadline = time.monotonic() + timeout_s
        backoff = Backoff(min(0.05, backoff_cap_s), backoff_cap_s)

        def sleep(seconds: float) -> None:
            time.sleep(max(0.0, min(seconds, deadline - time.monotonic())))

        def retry(call: Callable[[], T], what: str) -> T:  # through an outage, until the deadline
            return retry_call(call, what, backoff=backoff, log=log, deadline=deadline, sleep=sleep)

        heartbeat: Heartbeat | None = None
        try:
            retry(lambda: binding.bind(outbox_dir, store), "checking which database the outbox belongs to")
            heartbeat = _heartbeat_for_owner(outbox_dir, dsn, store, backoff, retry, sleep)
            flusher = Flusher(reader, store, config.flusher_config(), sleep=sleep,
                              marks=marks_for(reader, store, config.flusher_config()))
            if reapply:
                _rewind(flusher, from_start, retry)
            stats = _drain_loop(flusher, outbox_dir, deadline, progress, heartbeat)
            _give_back(outbox_dir, store, retry)
            if heartbeat is not None:
                _requeue_orphans(outbox_dir, store, heartbeat, retry)
            return stats
        finally:
            if heartbeat is not None:
                heartbeat.stop(wait_s=1.0)
                _release(store, heartbeat)
            store.close()
            reader.close()
    finally:
        os.close(lock_fd)


def _rewind(flusher: Flusher, from_start: bool, retry: recovery.Retry) -> None:
    """``outbox reapply``: read again, and apply, the kept records the database's mark does not hold."""
    marks = flusher.marks
    assert marks is not None
    retry(lambda: marks.went_back(by_hand=True, from_start=from_start), "reading the outbox's mark")
    flusher.check_wanted = False


def _give_back(outbox_dir: str, store: PgStore, retry: recovery.Retry) -> None:
    """The owner's last stop kept jobs in ``giveback.json``: give them back now that every
    outcome is applied; a database that stays away fails the drain, saying what is left."""
    try:
        recovery.give_back_saved(outbox_dir, store, retry)
    except StoreError as exc:
        jobs, claims = layout.count_giveback(outbox_dir)
        raise DrainTimeout(f"every outcome was applied, but {jobs} unstarted jobs and {claims} lost claims kept in "
                           f"{layout.GIVEBACK_FILE} could not be given back ({exc}); run drain again") from exc


def _requeue_orphans(outbox_dir: str, store: PgStore, heartbeat: Heartbeat, retry: recovery.Retry) -> None:
    """Every outcome applied: the owner's jobs still running have no outcome anywhere, so their
    handlers never finished; settle them as the owner's next start would, so its row can go
    when the drain ends. Not while a process still writes a shard here (a child of a worker
    that died a moment ago) or another worker took the id: then the row stays, naming no
    process, for that start or the rescuer."""
    if heartbeat.conflict is not None or any(is_locked(p) for p in layout.shard_lock_names(outbox_dir)):
        return
    worker_id = heartbeat.worker_id
    try:
        recovery.settle_orphans(outbox_dir, store, retry, worker_id, started.previous(outbox_dir), ORPHANED)
    except StoreError as exc:
        log.warning("could not requeue the jobs worker %s was running (%s); the rescuer will", worker_id, exc)


def _release(store: PgStore, heartbeat: Heartbeat) -> None:
    """The drain is over: its heartbeat row names no live process any more, so the worker
    started next under this id on this host does not wait to see it go silent (this
    process may live on: a Python caller, the outage demo)."""
    if heartbeat.conflict is not None:
        return  # the row is another live worker's
    try:
        store.release_worker(heartbeat.worker_id, socket.gethostname(), os.getpid())
    except StoreError as exc:
        log.debug("could not release the heartbeat row of worker %s: %s", heartbeat.worker_id, exc)


def _heartbeat_for_owner(outbox_dir: str, dsn: str, store: PgStore, backoff: Backoff, retry: recovery.Retry,
                         sleep: Callable[[float], None]) -> Heartbeat | None:
    """Beat for the worker id stored in the outbox (none before its first run); no rescuing.
    Refused (``WorkerIdInUse``) while another live worker uses that id (``shardworker.worker.identity``)."""
    worker_id = layout.read_worker_id(outbox_dir)
    if not worker_id:
        return None
    retry(lambda: identity.check_worker_id(store, worker_id, HEARTBEAT_INTERVAL_S, sleep=sleep),
          "checking that no live worker uses this worker id")
    heartbeat = Heartbeat(PgStore(StoreConfig(dsn=dsn)), worker_id, HEARTBEAT_INTERVAL_S, None, backoff)
    heartbeat.start()
    return heartbeat


def _drain_loop(flusher: Flusher, outbox_dir: str, deadline: float,
                progress: Callable[[FlushStats, int], None] | None, heartbeat: Heartbeat | None) -> FlushStats:
    while True:
        if heartbeat is not None and heartbeat.conflict is not None:
            raise heartbeat.conflict
        flusher.run_once()
        if progress:
            progress(flusher.stats, flusher.in_hand)
        if flusher.idle:
            return flusher.stats
        if time.monotonic() >= deadline:
            pending = outbox_status(outbox_dir).pending
            raise DrainTimeout(f"{pending} outcomes still pending after the timeout "
                               f"({flusher.stats.db_errors} database errors); run drain again")
