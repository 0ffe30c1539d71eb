"""Giving back, at the next start, the jobs a stop could not give back.

A stop during an outage cannot release the jobs no child started, nor the jobs of claims
whose reply was lost; ``Dispatcher.give_back`` then keeps them in the outbox directory's
``giveback.json`` (``shardworker.layout``). The next start on that directory, and
``outbox drain``, release them here: after the flusher has applied every pending outcome
and before orphans are requeued (which would charge each an attempt), with the fenced
statements a stop uses (``job_release`` by id, attempt and worker; ``job_release_claim``
by token). A job rescued or changed meanwhile is simply not matched. Jobs whose handler
was running when the worker died are not here: unfinished work is at-least-once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from shardworker import layout

log = logging.getLogger(__name__)


class GiveBackStore(Protocol):
    def release(self, jobs: Sequence[tuple[int, int]], worker_id: str) -> int: ...
    def release_claim(self, claim_token: str, worker_id: str) -> int: ...


def release_saved(directory: str, store: GiveBackStore) -> int:
    """Release everything ``giveback.json`` holds, then remove it; returns how many jobs were
    released. A ``StoreError`` leaves the file whole: releasing again is harmless (fenced)."""
    held = layout.read_giveback(directory)
    if not held:
        return 0
    released = 0
    for worker_id, entry in held.items():
        released += store.release([(j, a) for j, a in entry["jobs"]], worker_id)
        for token in entry["claims"]:
            released += store.release_claim(token, worker_id)
    layout.remove_giveback(directory)
    jobs = sum(len(e["jobs"]) for e in held.values())
    claims = sum(len(e["claims"]) for e in held.values())
    log.info("gave back %d jobs left unstarted at the last stop, no attempt charged (%d jobs and %d lost claims "
             "were kept; a job rescued or changed since is left as it is)", released, jobs, claims)
    return released
