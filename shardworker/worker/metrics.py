"""Prometheus metrics of one worker, served by the parent (``run --metrics-port``).

Counts are made where the work happens and travel with what is already sent, so the hot
path takes no lock of its own and no process shares a registry:

* a child's committer thread, the only one that reports durable outcomes, sums each
  commit's outcomes by kind (count per outcome, handler-duration buckets) and sends that
  summary in the same ``Done`` message as the keys (``summarize``); the parent's
  dispatcher adds it to ``JobCounts``;
* the flusher writes its counters into the shared-memory struct it already shares with
  the parent (one writer per field), which the parent's handle sums across restarts;
* the rest (claims, backlog, the database's state) are the parent's own fields;
* the backlog by queue and kind (available, scheduled, prefetched, running, oldest available
  age) is the whole database's, not this worker's: one worker at a time computes it, at
  most every ``housekeeping.BACKLOG_INTERVAL_S``, and every worker's housekeeping thread reads the last
  report (``shardworker.worker.housekeeping``); ``shardworker_backlog_report_age_seconds``
  says how old the numbers are. Every worker shows the same values: aggregate them across
  workers with ``max``, not ``sum``.

* the CPU and memory of each process of the tree (the parent, each child, the flusher) are
  read from ``/proc`` at scrape time (``process_metrics``).

Nothing is a ``prometheus_client`` metric object: ``WorkerCollector.collect`` reads those
values when Prometheus scrapes and builds the metric families then, on the server's
thread. The outbox's per-shard counts come from reading its files (``outbox.status``),
at most every ``OUTBOX_REFRESH_S``.
"""

from __future__ import annotations

import hmac
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

import outbox
from shardworker.core.jobstats import DURATION_BUCKETS, OUTCOMES, STEPS_AT, JobCounts
from shardworker.core.layout import PARENT_SHARD
from shardworker.errors import ConfigError
from shardworker.flusher.loop import BATCH_BUCKETS

if TYPE_CHECKING:
    from shardworker.worker.housekeeping import Backlog

log = logging.getLogger(__name__)

OUTBOX_REFRESH_S = 1.0
BACKLOG_GAUGES = (("available", "Jobs queued and due, by queue and kind (every worker's view of the database)."),
                  ("scheduled", "Jobs queued for later (run_at ahead), by queue and kind."),
                  ("prefetched", "Jobs claimed by a live worker whose handler has not started, by queue and kind."),
                  ("running", "Jobs whose handler started and whose outcome has not been applied, by queue and kind."))


class WorkerView(Protocol):
    """What the collector reads from the parent (the supervisor provides it)."""

    @property
    def outbox_dir(self) -> str: ...
    @property
    def job_counts(self) -> JobCounts: ...
    def claimed_total(self) -> int: ...
    def unapplied(self) -> int: ...
    def in_flight(self) -> int: ...
    def database_up(self) -> bool: ...
    def flusher_counters(self) -> dict[str, Any]: ...
    def backlog(self) -> Backlog | None: ...
    def processes(self) -> list[tuple[str, int]]: ...


class WorkerCollector(Collector):
    """Builds every metric family at scrape time from ``WorkerView``."""

    def __init__(self, view: WorkerView, clock: Callable[[], float] = time.monotonic) -> None:
        self.view, self.clock = view, clock
        self._outbox: outbox.OutboxStatus | None = None
        self._outbox_next = 0.0
        self._lock = threading.Lock()  # scrapes, not the hot path: one outbox read at a time

    def describe(self) -> Iterable[Metric]:
        return []  # collected at scrape time only; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        v = self.view
        yield _counter("shardworker_jobs_claimed", "Jobs this worker claimed.", v.claimed_total())
        yield from self._job_metrics(v.job_counts.snapshot())
        yield _gauge("shardworker_jobs_in_flight", "Jobs sent to children and not yet reported durable.",
                     v.in_flight())
        yield _gauge("shardworker_outcomes_unapplied",
                     "Outcomes durable in the outbox and not yet applied to PostgreSQL (computed, not yet stored).",
                     v.unapplied())
        yield _gauge("shardworker_database_up", "1 when PostgreSQL answered the worker's last claim and flush.",
                     1 if v.database_up() else 0)
        yield from self._flusher_metrics(v.flusher_counters())
        yield from self._outbox_metrics()
        yield from self._backlog_metrics(v.backlog())
        yield from process_metrics(v.processes())

    def _backlog_metrics(self, backlog: Backlog | None) -> Iterator[Metric]:
        if backlog is None:
            return  # no report read yet
        gauges = [GaugeMetricFamily(f"shardworker_jobs_{name}", doc, labels=["queue", "kind"])
                  for name, doc in BACKLOG_GAUGES]
        oldest = GaugeMetricFamily("shardworker_oldest_available_age_seconds",
                                   "How long the oldest available job has waited since it fell due (0 when none), "
                                   "by queue and kind; waiting_on: paused (its queue), limit (its kind or queue at a "
                                   "concurrency limit across workers) or capacity (the workers are busy).",
                                   labels=["queue", "kind", "waiting_on"])
        full = {(limit.scope, limit.name) for limit in backlog.limits
                if limit.full and limit.limit in ("global_concurrency", "concurrency")}
        paused = {limit.name for limit in backlog.limits if limit.limit == "paused"}
        for row in backlog.rows:
            if row.kind is None:
                continue  # a queue with a state row and no jobs: nothing to count
            labels = [row.queue, row.kind]
            for gauge, value in zip(gauges, (row.available, row.scheduled, row.prefetched, row.running), strict=True):
                gauge.add_metric(labels, value)
            held = ("kind", row.kind) in full or ("queue", row.queue) in full
            waiting_on = "paused" if row.queue in paused else "limit" if held else "capacity"
            oldest.add_metric([*labels, waiting_on], row.oldest_available_s or 0.0)
        yield from gauges
        yield oldest
        yield from self._limit_metrics(backlog)
        yield _gauge("shardworker_backlog_report_age_seconds",
                     "Age of the backlog report the gauges above show.", max(0.0, self.clock() - backlog.computed_at))

    def _limit_metrics(self, backlog: Backlog) -> Iterator[Metric]:
        """Each limit across workers and its use (the database's, as the backlog's rows)."""
        labels = ["kind", "queue", "limit"]  # a kind's limit has queue "", a queue's kind ""
        limit = GaugeMetricFamily("shardworker_limit", "A limit across workers: a kind's or a queue's concurrency "
                                  "(global_concurrency, concurrency), key_concurrency (per key), or rate (starts "
                                  "a second), or a queue's pause (0).", labels=labels)
        in_use = GaugeMetricFamily("shardworker_limit_in_use", "What uses a limit now: running (claimed) jobs; for a "
                                   "key_concurrency the busiest key's.", labels=labels)
        for row in backlog.limits:
            names = [row.name, ""] if row.scope == "kind" else ["", row.name]
            limit.add_metric([*names, row.limit], row.value)
            if row.in_use is not None:
                in_use.add_metric([*names, row.limit], row.in_use)
        yield limit
        yield in_use

    def _job_metrics(self, by_kind: dict[str, list[float]]) -> Iterator[Metric]:
        outcomes = CounterMetricFamily("shardworker_jobs_finished",
                                       "Outcomes made durable in the outbox, by kind and outcome "
                                       "(retried: a failed attempt with attempts left).", labels=["kind", "outcome"])
        durations = HistogramMetricFamily("shardworker_handler_duration_seconds",
                                          "Seconds from a handler's start to its outcome.", labels=["kind"])
        steps = [CounterMetricFamily(f"shardworker_steps_{event}", doc, labels=["kind"]) for event, doc in (
            ("recorded", "Steps (job.step) whose result was made durable in the outbox, by kind."),
            ("replayed", "Steps given back their result from an earlier attempt, by kind (fn not called)."))]
        n = len(OUTCOMES)
        for kind, row in sorted(by_kind.items()):
            for i, name in enumerate(OUTCOMES):
                outcomes.add_metric([kind, name], row[i])
            cumulative, buckets = 0.0, []
            for bound, count in zip((*DURATION_BUCKETS, float("inf")), row[n + 1:STEPS_AT], strict=True):
                cumulative += count
                buckets.append((_bound(bound), cumulative))
            durations.add_metric([kind], buckets, row[n])
            for i, family in enumerate(steps):
                family.add_metric([kind], row[STEPS_AT + i])
        yield outcomes
        yield durations
        yield from steps

    def _flusher_metrics(self, c: dict[str, Any]) -> Iterator[Metric]:
        yield _counter("shardworker_outcomes_applied", "Outcomes the flusher applied to PostgreSQL.", c["applied"])
        yield _counter("shardworker_outcomes_replayed",
                       "Outcomes found applied already: a batch whose commit's reply was lost (the database "
                       "stopped as it committed) or read again after a lost checkpoint.", c["replayed"])
        yield _counter("shardworker_outcomes_stale",
                       "Outcomes kept in stale.jsonl, not applied: a newer attempt owned the job.", c["stale"])
        yield _counter("shardworker_outcomes_set_aside",
                       "Outcomes kept in setaside.jsonl: their jobs do not exist in this database.", c["missing"])
        yield _counter("shardworker_outcomes_deadlettered",
                       "Outcomes PostgreSQL refused for good (in deadletter/); their jobs failed instead.",
                       c["deadlettered"])
        yield _counter("shardworker_database_errors", "Failed database operations (claims and flushes).",
                       c["db_errors"])
        yield _counter("shardworker_followups_inserted",
                       "Follow-up jobs (job.enqueue) inserted with their parents' done outcomes.", c["followups"])
        batches = HistogramMetricFamily("shardworker_flush_batch_size", "Outcomes per batch the flusher applied.")
        cumulative, buckets = 0.0, []
        for bound, count in zip((*BATCH_BUCKETS, float("inf")), c["batch_buckets"], strict=True):
            cumulative += count
            buckets.append((_bound(bound), cumulative))
        batches.add_metric([], buckets, c["batch_sum"])
        yield batches

    def _outbox_metrics(self) -> Iterator[Metric]:
        status = self._outbox_status()
        pending = GaugeMetricFamily("shardworker_outbox_pending", "Outcomes in the outbox not yet applied, per shard.",
                                    labels=["shard"])
        size = GaugeMetricFamily("shardworker_outbox_pending_bytes", "Bytes of those outcomes, per shard.",
                                 labels=["shard"])
        oldest = GaugeMetricFamily("shardworker_outbox_oldest_age_seconds",
                                   "Age of the oldest outcome not yet applied, per shard (0 when none).",
                                   labels=["shard"])
        for shard in status.shards if status else ():
            label = ["parent" if shard.shard == PARENT_SHARD else str(shard.shard)]
            pending.add_metric(label, shard.pending)
            size.add_metric(label, shard.pending_bytes)
            oldest.add_metric(label, shard.oldest_age_s or 0.0)
        yield pending
        yield size
        yield oldest
        yield _gauge("shardworker_outbox_quarantined_segments", "Corrupt segments set aside in quarantine/.",
                     len(status.quarantined) if status else 0)

    def _outbox_status(self) -> outbox.OutboxStatus | None:
        """At most every ``OUTBOX_REFRESH_S``, and never more than 5% of the time: reading a
        big outbox (a long outage) is paid for rarely, not at every scrape."""
        with self._lock:
            if self.clock() >= self._outbox_next:
                started = self.clock()
                try:
                    self._outbox = outbox.status(self.view.outbox_dir)
                except OSError as exc:
                    log.debug("outbox status for metrics failed: %s", exc)
                took = self.clock() - started
                self._outbox_next = self.clock() + max(OUTBOX_REFRESH_S, 20 * took)
            return self._outbox


def process_metrics(processes: Iterable[tuple[str, int]]) -> Iterator[Metric]:
    """CPU and memory of each process of the worker's tree, by role (``parent``, ``shard-N``,
    ``flusher``), read from ``/proc`` at scrape time: where the worker spends, process by process
    (the client library's own process collector sees the parent alone). Nothing where there is
    no ``/proc``, or for a process that has just gone."""
    cpu = CounterMetricFamily("shardworker_process_cpu_seconds", "CPU time (user and system) each process of "
                              "the worker has used, by role.", labels=["role"])
    rss = GaugeMetricFamily("shardworker_process_resident_memory_bytes", "Resident memory of each process of the "
                            "worker, by role.", labels=["role"])
    ticks, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    for role, pid in processes:
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat, open(f"/proc/{pid}/statm", "rb") as statm:
                fields = stat.read().rsplit(b")", 1)[1].split()
                resident = int(statm.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
        cpu.add_metric([role], (int(fields[11]) + int(fields[12])) / ticks)  # utime, stime (fields 14, 15)
        rss.add_metric([role], resident * page)
    yield cpu
    yield rss


def _bound(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


# serving -------------------------------------------------------------------------------


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    timeout = 10  # a client that connects and sends nothing does not hold a thread for ever
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics: " + format, *args)


@dataclass
class MetricsServer:
    """``/metrics`` on ``host:port`` in a daemon thread; with a ``token``, only requests
    carrying ``Authorization: Bearer <token>`` get an answer (401 otherwise)."""

    host: str
    port: int
    collectors: Sequence[Collector]
    token: str | None = None

    def __post_init__(self) -> None:
        registry = CollectorRegistry(auto_describe=False)
        for collector in self.collectors:
            registry.register(collector)
        self._app = make_wsgi_app(registry)
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    def _guarded(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if self.token is not None:
            scheme, _, given = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
            # WSGI hands a header's bytes over as latin-1 text (so .encode("latin-1") gives the
            # bytes sent back); the scheme is case-insensitive (RFC 7235).
            sent = given.strip().encode("latin-1", "replace")
            if scheme.lower() != "bearer" or not hmac.compare_digest(sent, self.token.encode()):
                start_response("401 Unauthorized", [("Content-Type", "text/plain"),
                                                    ("WWW-Authenticate", 'Bearer realm="shardworker"')])
                return [b"a bearer token is required\n"]
        if environ.get("PATH_INFO") not in ("/metrics", "/"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"metrics are at /metrics\n"]
        return self._app(environ, start_response)

    def start(self) -> None:
        """Bind (``OSError`` when the port is taken) and serve in the background."""
        try:
            self._httpd = make_server(self.host, self.port, self._guarded,
                                      server_class=_Server6 if ":" in self.host else _Server,
                                      handler_class=_QuietHandler)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {self.host}:{self.port}: {exc.strerror or exc}") from exc
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="shardworker-metrics", daemon=True)
        self._thread.start()
        log.info("metrics at http://%s:%d/metrics%s", self.host, self.port,
                 " (bearer token required)" if self.token else "")

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
