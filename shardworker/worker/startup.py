"""A worker's start, before it claims: the checks, then the recovery.

The checks (steps 1 and 2 of ``shardworker.worker.supervisor``): the schema is there (and
the handlers' limits across workers are written to ``shardworker.kinds``), the
outbox belongs to this database (bound at first use), no process of a previous run still
writes a shard of this outbox, and no other live worker uses this worker id
(``shardworker.worker.identity``). The recovery (step 4), once the flusher runs: wait until
it has applied every pending outcome, then settle what the last run left
(``shardworker.worker.recovery``, which ``outbox drain`` runs too). Each waits out an
outage, retrying, until a signal; the supervisor decides when each runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from outbox import try_lock
from shardworker.app import HandlerSpec
from shardworker.core import binding, layout, procs
from shardworker.core.config import WorkerConfig
from shardworker.core.retry import Backoff, is_retryable, retry_call
from shardworker.errors import OutboxBusy
from shardworker.flusher.process import FlusherHandle
from shardworker.worker import identity, recovery
from shardworker.worker.kindcaps import caps_that_fill_every_child
from shardworker.worker.started import Started

if TYPE_CHECKING:
    from shardworker.store.pg_store import PgStore  # imported by the parent once its children are forked

log = logging.getLogger(__name__)

T = TypeVar("T")

ORPHANED = "worker restarted while the job was running"


class StoppedWhileStarting(Exception):
    """A stop came while a step of the start waited out an outage (retrying)."""


class Startup:
    """The checks and the recovery of one worker's start."""

    def __init__(self, config: WorkerConfig, store: PgStore, flusher: FlusherHandle, backoff: Callable[[], Backoff],
                 stopping: Callable[[], bool]) -> None:
        self.config, self.store, self.flusher = config, store, flusher
        self.backoff, self.stopping = backoff, stopping

    def _retry(self, call: Callable[[], T], what: str) -> T:
        try:
            return retry_call(call, what, backoff=self.backoff(), log=log, should_stop=self.stopping,
                              sleep=lambda delay: procs.sleep_until(time.monotonic() + delay, self.stopping))
        except Exception as exc:
            if self.stopping() and is_retryable(exc):  # an outage waited out: the stop ends it quietly
                raise StoppedWhileStarting from None
            raise

    @contextlib.contextmanager
    def stoppable(self) -> Iterator[None]:
        """Around the steps: a step a stop cut short (``StoppedWhileStarting``) ends them quietly."""
        with contextlib.suppress(StoppedWhileStarting):
            yield

    def check_schema(self) -> None:
        self._retry(self.store.check_schema, "checking the schema")

    def register_kinds(self, specs: list[HandlerSpec]) -> None:
        """Make this worker's limits across workers (global_concurrency, rate) the kinds'; say
        which caps leave no child free for other kinds."""
        self._retry(lambda: self.store.register_kinds(specs), "registering the kinds' limits")
        for line in caps_that_fill_every_child({spec.kind: spec for spec in specs}, self.config.procs):
            log.warning("%s", line)

    def bind(self) -> None:
        self._retry(lambda: binding.bind(self.config.outbox_dir, self.store, embedded=self.config.embedded_db),
                    "checking which database the outbox belongs to")

    def check_worker_id(self, worker_id: str) -> None:
        self._retry(lambda: identity.check_worker_id(self.store, worker_id, self.config.heartbeat_interval_s,
                                                     should_stop=self.stopping),
                    "checking that no live worker uses this worker id")

    def recover(self, worker_id: str, started: Started, wait_for_flusher: bool = True) -> bool:
        """Apply pending outcomes (unless ``wait_for_flusher`` is false: the outbox held none
        at start), then settle our running jobs that have none (``started``: the ids of those
        whose handler started, from ``shardworker.worker.started``); False when a signal came first."""
        waited_since = time.monotonic()
        while wait_for_flusher and not self.flusher.drained:
            self.flusher.check()
            if self.stopping():
                return False
            if time.monotonic() - waited_since > 5:
                log.info("waiting for the flusher to apply pending outcomes before claiming")
                waited_since = time.monotonic()
            time.sleep(0.02)
        recovery.give_back_saved(self.config.outbox_dir, self.store, self._retry)
        if self.stopping():
            return False  # a signal, or another live worker under our id: its running jobs are not orphans
        recovery.settle_orphans(self.config.outbox_dir, self.store, self._retry, worker_id, started, ORPHANED)
        return True


def wait_for_writers_gone(outbox_dir: str, timeout_s: float = 60.0) -> None:
    """Wait until no process still writes a shard of ``outbox_dir`` (children of a worker
    that died a moment ago), so recovery sees every outcome they acknowledged."""

    def held() -> int:
        for path in layout.shard_lock_names(outbox_dir):
            fd = try_lock(path)
            if fd is None:
                raise OutboxBusy(f"{os.path.basename(path)} in {outbox_dir} is still held by another process")
            os.close(fd)
        return 0

    procs.wait_for_lock(held, OutboxBusy, timeout_s)
