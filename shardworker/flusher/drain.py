"""``outbox drain``: apply every pending outcome of an outbox directory, then stop.

It refuses while a worker (or another drain) holds the directory, refuses a database the
outbox does not belong to (``shardworker.binding``), waits out an unreachable database up
to a timeout, and works on a directory copied from a dead host: shards without a live
writer are recovered (torn tails cut, segments sealed) and read. While it drains it
heartbeats for the worker whose outbox this is, so no peer rescues (and re-runs) jobs whose
outcomes it is applying; like a worker, it first makes sure no live worker uses that id.
Once every outcome is applied, it gives back (uncharged) the jobs the owner's last stop
could not give back (``shardworker.worker.giveback``), then, of the ones the owner was
running with no outcome, gives back uncharged those its children never started (their
progress files: ``shardworker.worker.started``) and requeues the rest, charged an attempt, as
the next start would; then its heartbeat row goes.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable

from outbox import OutboxLocked
from outbox import status as outbox_status
from outbox.fsutil import is_locked
from shardworker import binding, layout
from shardworker.config import StoreConfig, WorkerConfig
from shardworker.errors import DrainTimeout, OutboxBusy, StoreError
from shardworker.flusher.loop import Flusher, FlushStats
from shardworker.flusher.process import marks_for, open_reader
from shardworker.retry import Backoff, retry_call
from shardworker.store.pg_store import PgStore
from shardworker.worker import giveback, identity, started
from shardworker.worker.heartbeat import Heartbeat

log = logging.getLogger(__name__)

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

        heartbeat: Heartbeat | None = None
        try:
            retry_call(lambda: binding.bind(outbox_dir, store), "checking which database the outbox belongs to",
                       backoff=backoff, log=log, deadline=deadline, sleep=sleep)
            heartbeat = _heartbeat_for_owner(outbox_dir, dsn, store, backoff, deadline, sleep)
            flusher = Flusher(reader, store, config.flusher_config(), sleep=sleep,
                              marks=marks_for(reader, store, config.flusher_config()))
            if reapply:
                _rewind(flusher, from_start, backoff, deadline, sleep)
            stats = _drain_loop(flusher, outbox_dir, deadline, progress, heartbeat)
            _give_back(outbox_dir, store, backoff, deadline, sleep)
            if heartbeat is not None:
                _requeue_orphans(outbox_dir, store, heartbeat, backoff, deadline, sleep)
            return stats
        finally:
            if heartbeat is not None:
                heartbeat.stop(wait_s=1.0)
                _release(store, heartbeat)
            store.close()
            reader.close()
    finally:
        os.close(lock_fd)


def _rewind(flusher: Flusher, from_start: bool, backoff: Backoff, deadline: float,
            sleep: Callable[[float], None]) -> None:
    """``outbox reapply``: read again, and apply, the kept records the database's mark does not hold."""
    marks = flusher.marks
    assert marks is not None
    retry_call(lambda: marks.went_back(by_hand=True, from_start=from_start), "reading the outbox's mark",
               backoff=backoff, log=log, deadline=deadline, sleep=sleep)
    flusher.check_wanted = False


def _give_back(outbox_dir: str, store: PgStore, backoff: Backoff, deadline: float,
               sleep: Callable[[float], None]) -> None:
    """Give back, uncharged, the jobs the owner's last stop kept in ``giveback.json``: now
    that every outcome is applied, as a worker's start would (``shardworker.worker.giveback``)."""
    try:
        retry_call(lambda: giveback.release_saved(outbox_dir, store), "giving back jobs left unstarted at the "
                   "last stop", backoff=backoff, log=log, deadline=deadline, sleep=sleep)
    except StoreError as exc:
        jobs, claims = layout.count_giveback(outbox_dir)
        raise DrainTimeout(f"every outcome was applied, but {jobs} unstarted jobs and {claims} lost claims kept in "
                           f"{layout.GIVEBACK_FILE} could not be given back ({exc}); run drain again") from exc


def _requeue_orphans(outbox_dir: str, store: PgStore, heartbeat: Heartbeat, backoff: Backoff, deadline: float,
                     sleep: Callable[[float], None]) -> None:
    """Every outcome applied: the owner's jobs still running have no outcome anywhere, so their
    handlers never finished; requeue them (the lost run counts as an attempt) as the owner's
    next start would, so its row can go when the drain ends. Not while a process still writes
    a shard here (a child of a worker that died a moment ago) or another worker took the id:
    then the row stays, naming no process, for that start or the rescuer."""
    if heartbeat.conflict is not None or any(is_locked(p) for p in layout.shard_lock_names(outbox_dir)):
        return
    worker_id, found = heartbeat.worker_id, started.previous(outbox_dir)  # None: not known, every one is charged
    try:
        released = 0 if found is None else retry_call(
            lambda: store.release_unstarted(worker_id, found), "giving back jobs the worker's children never started",
            backoff=backoff, log=log, deadline=deadline, sleep=sleep)
        requeued = retry_call(lambda: store.requeue_orphans(worker_id, ORPHANED),
                              "requeueing jobs the worker was running when it stopped", backoff=backoff, log=log,
                              deadline=deadline, sleep=sleep)
    except StoreError as exc:
        log.warning("could not requeue the jobs worker %s was running (%s); the rescuer will", worker_id, exc)
        return
    if released or requeued:
        log.info("of the jobs worker %s held when it stopped, %d never started, given back uncharged, and %d had "
                 "started: requeued, charged an attempt", worker_id, released, len(requeued))


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


def _heartbeat_for_owner(outbox_dir: str, dsn: str, store: PgStore, backoff: Backoff, deadline: float,
                         sleep: Callable[[float], None]) -> Heartbeat | None:
    """Beat for the worker id stored in the outbox (none before its first run); no rescuing.
    Refused (``WorkerIdInUse``) while another live worker uses that id (``shardworker.worker.identity``)."""
    worker_id = layout.read_worker_id(outbox_dir)
    if not worker_id:
        return None
    retry_call(lambda: identity.check_worker_id(store, worker_id, HEARTBEAT_INTERVAL_S, sleep=sleep),
               "checking that no live worker uses this worker id", backoff=backoff, log=log, deadline=deadline,
               sleep=sleep)
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
