"""What a worker's last run left in the database, settled once every outcome of its outbox
is applied: the one recovery, run by a worker's start (``shardworker.worker.startup``) and
by ``outbox drain`` (``shardworker.worker.drain``), in this order:

1. Give back, uncharged, the jobs a stop during an outage kept in ``giveback.json``
   (``shardworker.worker.giveback``): their children never started them.
2. Of the jobs the database still shows ``running`` under this worker id, give back,
   uncharged, those no child started (the progress files: ``shardworker.worker.started``;
   None there means nothing is known, and every one is charged) ...
3. ... and requeue the rest, charged an attempt: their handlers started and no outcome of
   theirs is anywhere, so they never finished. A requeue at the last attempt fails the job,
   and its dependents settle (``shardworker.store``).

Only after the outbox is applied: an outcome still waiting there would otherwise be
overtaken by a requeue, and its job run again. Each statement is fenced by worker id and
attempt, so a job rescued or changed meanwhile is left as it is, and running the recovery
again is harmless. The caller says how to retry through an outage (``Retry``): a start
waits until a signal, a drain until its deadline.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import Protocol, TypeVar

from shardworker.worker import giveback
from shardworker.worker import started as started_file
from shardworker.worker.started import Started

log = logging.getLogger(__name__)

T = TypeVar("T")
Retry = Callable[[Callable[[], T], str], T]  # (call, what it does): the call's value, retried through an outage


class RecoveryStore(giveback.GiveBackStore, Protocol):
    def release_unstarted(self, worker_id: str, started: Collection[int]) -> int: ...
    def requeue_orphans(self, worker_id: str, reason: str) -> Sequence[int]: ...


def give_back_saved(outbox_dir: str, store: RecoveryStore, retry: Retry) -> None:
    """Step 1: the jobs a stop during an outage could not give back."""
    retry(lambda: giveback.release_saved(outbox_dir, store), "giving back jobs left unstarted at the last stop")


def settle_orphans(outbox_dir: str, store: RecoveryStore, retry: Retry, worker_id: str, started: Started,
                   reason: str) -> None:
    """Steps 2 and 3 for ``worker_id``'s running jobs (``started``: the ids whose handler
    started), ``reason`` going into the error of each requeued one; then the progress the
    earlier run kept is forgotten (``started.recovered``)."""
    released = 0
    if started is not None:
        released = retry(lambda: store.release_unstarted(worker_id, started), "giving back jobs no child started")
    requeued = retry(lambda: store.requeue_orphans(worker_id, reason),
                     "requeueing the jobs the worker was running when it stopped")
    if released or requeued:
        log.info("of the jobs worker %s held when it last stopped, %d never started, given back uncharged, and %d "
                 "had started: requeued, charged an attempt", worker_id, released, len(requeued))
    started_file.recovered(outbox_dir)
