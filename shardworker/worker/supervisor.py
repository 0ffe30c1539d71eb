"""The supervisor: the order of things in one worker's life.

1. Take the outbox directory's worker lock; know the worker id; wait until no process of a previous
   run still writes a shard of this outbox; read which jobs its children started.
2. Fork the children (before the store, so psycopg's ~13 MB is not theirs), then the
   flusher: nothing is connected and no thread runs yet, and what the parent imported (the
   app too) is theirs at once, frozen first (``gc.freeze``) so no collection unshares its
   pages. A child or flusher that dies later is spawned. No child gets a job before step 5.
3. Wait for the schema; bind the outbox to this database at first use, or refuse another
   database; make sure no other live worker uses this worker id
   (``shardworker.worker.identity``); start heartbeating (its own thread and connection).
4. Startup recovery: wait until the flusher has applied every pending outcome (if the outbox
   held any at step 1), give back uncharged the jobs a stop in an outage left in
   ``giveback.json`` and this worker's running jobs no child started, requeue the rest.
5. Start the housekeeping thread (periodic jobs, retention, the watch for queued kinds no
   live worker serves); run the dispatcher until a signal, or idleness with
   ``exit_when_idle`` (then name once more the queued kinds no live worker serves).
6. Shut down: stop claiming, let children finish the job in hand, give back jobs never started (kept in
   ``giveback.json`` for step 4 of the next start when the database is away), let the flusher apply what
   the database accepts (all bounded by ``shutdown_timeout_s``; during an outage, what needs the database
   gets only ``DATABASE_WAIT_IN_OUTAGE_S``), stop housekeeping and heartbeating, forget the worker. A
   second signal exits at once. A crash loop (``CrashLoop``) shuts down the same way, then is raised.
Each step is another module's: this one only decides when.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from outbox import OutboxError
from outbox import status as outbox_status
from shardworker.app import App
from shardworker.core import layout, logs, procs
from shardworker.core.config import WorkerConfig
from shardworker.core.jobstats import JobCounts
from shardworker.core.retry import Backoff
from shardworker.core.views import Serving
from shardworker.errors import CrashLoop, ShardworkerError, StoreError
from shardworker.flusher.process import FlusherHandle
from shardworker.worker import started
from shardworker.worker.child_handle import flow_counts
from shardworker.worker.dispatcher import Dispatcher
from shardworker.worker.heartbeat import Heartbeat, Load
from shardworker.worker.housekeeping import Backlog, Housekeeper
from shardworker.worker.parent_outcomes import ParentOutcomes
from shardworker.worker.pool import ChildPool
from shardworker.worker.startup import Startup, wait_for_writers_gone
from shardworker.worker.unserved import UnservedWatch


def in_schema_note() -> str:
    """", in schema NAME" for the ready line of a worker of a schema of its own; else nothing."""
    from shardworker.core.config import DEFAULT_SCHEMA
    from shardworker.store.sql import current_schema

    return "" if current_schema() == DEFAULT_SCHEMA else f", in schema {current_schema()}"

if TYPE_CHECKING:
    from shardworker.store.pg_store import PgStore
    from shardworker.worker.metrics import MetricsServer

log = logging.getLogger(__name__)

DATABASE_WAIT_IN_OUTAGE_S = 3.0  # what a shutdown during an outage waits for the database


@dataclass
class RunSummary:
    done: int = 0  # outcomes made durable, of every kind (see outcomes)
    pending_outcomes: int = 0
    released: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)  # by jobstats.OUTCOMES name


class Supervisor:
    """Owns every process of one worker."""

    def __init__(self, config: WorkerConfig, app: App) -> None:
        app = app.with_default_timeout(config.default_timeout_s)  # the children apply the same
        self.config, self.app = config, app
        # The store and what uses it: made by _open_stores, once the children are forked.
        self.store: PgStore
        self.new_store: Callable[[], PgStore]
        self.unserved: UnservedWatch
        self.housekeeper: Housekeeper
        self._stores_open = self.stopping = self._outbox_empty = False  # _outbox_empty: see _fork_processes
        self._signalled = self._signal_fd = -1  # the pipe a signal writes to (_install_signals)
        self._started: started.Started = None  # what the last run's children started (_fork_processes)
        self.worker_id = ""
        self.flusher = FlusherHandle(config.outbox_dir, config.store_config(), config.flusher_config(),
                                     config.flush_idle_sleep_s)
        concurrent = any(spec.lane != "sync" for spec in app.handlers.values())
        self.min_jobs, self.max_jobs = config.prefetch_jobs(concurrent)
        children = [config.child_config(i, parent_pid=os.getpid(), slots=self.max_jobs) for i in range(config.procs)]
        self.pool = ChildPool(children, app.handlers, min_jobs=self.min_jobs, max_jobs=self.max_jobs,
                              max_bytes=config.prefetch_bytes, horizon_s=config.prefetch_horizon_s,
                              steal_after_s=config.steal_after_s, at_once=config.at_once(concurrent),
                              cancel_grace_s=config.cancel_grace_s)
        self.parent_outcomes = ParentOutcomes(config.outbox_dir, config.segment_bytes, app.handlers,
                                              self.pool.job_counts)
        self.heartbeat: Heartbeat | None = None
        self.dispatcher: Dispatcher | None = None
        self.schema_checked = False  # the database answered at startup (what database_up says until claims)
        self.metrics: MetricsServer | None = None

    def _serve_metrics(self) -> None:
        """Serve ``/metrics`` if asked; after the fork, as the store: prometheus_client is the
        parent's alone (a child loads only what running handlers needs)."""
        if self.config.metrics_port is None:
            return
        from shardworker.worker.metrics import MetricsServer, WorkerCollector

        self.metrics = MetricsServer(self.config.metrics_host, self.config.metrics_port, [WorkerCollector(self)],
                                     self.config.metrics_token)
        self.metrics.start()

    def _open_stores(self) -> None:
        from shardworker.worker.stores import open_stores  # imports psycopg: after the children's fork

        self.new_store, self.store, self.unserved, self.housekeeper = open_stores(self.config, self.app)
        self._stores_open = True

    def _backoff(self) -> Backoff:
        return Backoff(self.config.backoff_base_s, self.config.backoff_cap_s)

    # what the metrics read (shardworker.worker.metrics.WorkerView), from the server's thread -------

    @property
    def outbox_dir(self) -> str:
        return self.config.outbox_dir

    @property
    def job_counts(self) -> JobCounts:
        return self.pool.job_counts

    def claimed_total(self) -> int:
        return self.dispatcher.claimed_total if self.dispatcher else 0

    def unapplied(self) -> int:
        return self.dispatcher.backlog() if self.dispatcher else 0

    def in_flight(self) -> int:
        return self.pool.in_flight

    def database_up(self) -> bool:
        return self.dispatcher.watch.up if self.dispatcher else self.schema_checked

    def backlog(self) -> Backlog | None:
        return self.housekeeper.backlog

    def processes(self) -> list[tuple[str, int]]:
        """(role, pid) of every live process of the worker's tree: this one, the children, the flusher."""
        found = [("parent", os.getpid())]
        found += [(f"shard-{h.index}", h.process.pid) for h in self.pool.handles
                  if h.process is not None and h.process.pid is not None]
        if self.flusher.process is not None and self.flusher.process.pid is not None:
            found.append(("flusher", self.flusher.process.pid))
        return found

    def flusher_counters(self) -> dict[str, Any]:
        counters = self.flusher.counters()
        counters["db_errors"] += self.dispatcher.db_errors if self.dispatcher else 0
        return counters

    # the order of things ---------------------------------------------------------------

    def run(self) -> RunSummary:
        """Run until stopped (signal) or idle (``exit_when_idle``); returns a summary."""
        lock_fd = layout.lock_outbox(self.config.outbox_dir, "worker")
        procs.close_in_forked(lock_fd)
        try:
            self.worker_id = layout.resolve_worker_id(self.config.outbox_dir, self.config.worker_id)
            logs.set_worker_id(self.worker_id)
            self._install_signals()
            if self.stopping:  # a signal came while the app was imported: nothing is started
                return RunSummary()
            self._fork_processes()
            self._serve_metrics()
            if not self._start():
                self._raise_if_id_lost()
                return RunSummary()
            log.info("ready: claiming %s from %s (children: %d)%s", ", ".join(self.app.kinds) or "nothing",
                     ", ".join(self.config.queues or ["every queue"]), self.config.procs, in_schema_note())
            dispatcher = Dispatcher(self.config, self.worker_id, self.app.kinds, self.store, self.pool,
                                    self.flusher, self.parent_outcomes, stopping=lambda: self.stopping,
                                    heard=lambda: self.heartbeat.server if self.heartbeat is not None else "",
                                    released=lambda: self.heartbeat.released if self.heartbeat is not None else ())
            dispatcher.wake_fds.append(self._signalled)
            self.dispatcher = dispatcher
            self.housekeeper.start()  # always: it ends the waits (job.sleep, job.wait_event) that are over
            try:
                while not self.stopping and not dispatcher.run_once():
                    pass
            except CrashLoop:
                self._shutdown(dispatcher)
                raise
            if self.config.exit_when_idle and not self.stopping:
                self.unserved.tell_all()  # what it leaves behind, said once more
            summary = self._shutdown(dispatcher)
            self._raise_if_id_lost()
            return summary
        finally:
            self._kill_everything()
            if self.metrics is not None:
                self.metrics.stop()
            self.parent_outcomes.close()
            if self.heartbeat is not None:
                self.heartbeat.stop(wait_s=1.0)
            if self._stores_open:
                self.housekeeper.stop(wait_s=1.0)
                self.store.close()
            os.close(lock_fd)
            if self._signal_fd >= 0:
                procs.close_signal_wakeup_pipe(self._signalled, self._signal_fd)

    def _fork_processes(self) -> None:
        """Steps 1 (the wait for a previous run's writers) and 2; the store between the forks."""
        wait_for_writers_gone(self.config.outbox_dir)
        self._started = started.take_previous(self.config.outbox_dir, self.config.procs)  # before children rewrite it
        # Nothing pending: step 4 need not wait for the flusher (no child has a job yet). Unreadable: the flusher says.
        with contextlib.suppress(OSError, ValueError, OutboxError):
            self._outbox_empty = outbox_status(self.config.outbox_dir).pending == 0
        gc.freeze()
        self.pool.start(fork=True)
        self._open_stores()
        gc.freeze()
        self.flusher.start(fork=True)

    def _start(self) -> bool:
        """Steps 3 and 4 (``shardworker.worker.startup``); False when a signal came first, even mid-outage."""
        startup = Startup(self.config, self.store, self.flusher, self._backoff, lambda: self.stopping)
        with startup.stoppable():
            startup.check_schema()
            self.schema_checked = True
            startup.register_kinds(list(self.app.handlers.values()))
            startup.bind()
            startup.check_worker_id(self.worker_id)
            self._start_heartbeat()
            return startup.recover(self.worker_id, self._started, wait_for_flusher=not self._outbox_empty)
        return False

    def _install_signals(self) -> None:
        def on_signal(signum: int, _frame: Any) -> None:
            if self.stopping:
                log.warning("second signal: exiting now; acknowledged outcomes stay in the outbox")
                self._kill_everything()
                os._exit(1)
            log.info("signal %s: stopping (finishing jobs in hand; a second signal exits at once)", signum)
            self.stopping = True

        procs.handle_stop_signals(on_signal)
        self._signalled, self._signal_fd = procs.signal_wakeup_pipe()  # a signal ends the dispatcher's wait at once

    def _start_heartbeat(self) -> None:
        cfg = self.config
        self.heartbeat = Heartbeat(self.new_store(), self.worker_id, cfg.heartbeat_interval_s, cfg.rescue_after_s,
                                   self._backoff(), rescue_grace_s=cfg.rescue_grace_s, load=self._load,
                                   on_alive=self.pool.alive_until, on_conflict=self._id_lost,
                                   serves=Serving(tuple(self.app.kinds), cfg.queues, cfg.rescue_after_s,
                                                  cfg.release_slots_after_s),
                                   release_slots_after_s=cfg.release_slots_after_s)
        self.heartbeat.start()

    def _id_lost(self, exc: ShardworkerError) -> None:
        """From the heartbeat's thread: another live worker beats under our id, or a peer rescued our
        jobs (``WorkerRescued``); stop (giving back what we never started) and exit with ``exc``."""
        log.error("stopping: %s", exc)
        self.stopping = True

    def _raise_if_id_lost(self) -> None:
        if self.heartbeat is not None and self.heartbeat.conflict is not None:
            raise self.heartbeat.conflict

    def _load(self) -> Load:
        """(jobs running, outcomes not yet applied, flow report) for the heartbeat row; read
        from the heartbeat's thread, so only plain reads of the dispatcher's and pool's state."""
        dispatcher = self.dispatcher
        if dispatcher is None:
            return None, None, None
        try:
            return self.pool.in_flight, dispatcher.backlog(), flow_counts(self.pool.handles)
        except Exception:  # a count caught mid-change is not worth a missed heartbeat
            return None, None, None

    # shutdown ---------------------------------------------------------------------------

    def _shutdown(self, dispatcher: Dispatcher) -> RunSummary:
        deadline = time.monotonic() + self.config.shutdown_timeout_s
        self.pool.request_stop()
        deaths, unstarted = self.pool.finish(deadline, dispatcher.count_finished)
        dispatcher.settle(deaths)
        # With the database away, what needs it (giving back, applying outcomes) is tried briefly: nothing
        # is lost by leaving it. Unstarted jobs wait in giveback.json for the next start; outcomes, in the outbox.
        dispatcher.watch.update(dispatcher.db_failure())  # again here and below: the loop that looked has ended
        db_by = deadline if dispatcher.watch.up else min(deadline, time.monotonic() + DATABASE_WAIT_IN_OUTAGE_S)
        released = dispatcher.give_back(unstarted, db_by)
        self.flusher.stop(db_by)
        dispatcher.watch.update(dispatcher.db_failure())
        self.housekeeper.stop(wait_s=1.0)
        if self.heartbeat is not None:
            self.heartbeat.stop()
        try:
            # Kept while jobs stay running under our id, so a rescuer can still find them.
            self.store.forget_worker(self.worker_id, socket.gethostname(), os.getpid())
        except StoreError as exc:
            log.warning("could not remove this worker's heartbeat row (%s); it goes silent and a peer "
                        "removes it after --rescue-after", exc)
        pending = outbox_status(self.config.outbox_dir).pending
        if pending:
            log.warning("%d outcomes remain in the outbox %s; they apply at the next start, or run "
                        "`shardworker outbox drain --outbox-dir %s`", pending, self.config.outbox_dir,
                        self.config.outbox_dir)
        return RunSummary(dispatcher.done_total, pending, released, self.pool.job_counts.by_outcome())

    def _kill_everything(self) -> None:
        self.pool.kill_all()
        self.flusher.kill()
