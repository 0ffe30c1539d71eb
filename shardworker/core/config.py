"""Configuration, with every default in one place: ``WorkerConfig`` (what ``shardworker
run`` takes; its command-line defaults are read from here), and the parts each process
gets, derived from it by its methods: ``StoreConfig`` (a connection), ``FlusherConfig``
and ``ChildConfig``. All frozen, validated at construction, keyword arguments only.

Every duration carries its unit in its name. Defaults suit a production worker; tests
shrink the backoff caps and timeouts to keep outages short.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from outbox import Keep
from shardworker.core.layout import PARENT_SHARD
from shardworker.core.limits import (
    MAX_QUEUE_BYTES,
    MAX_WORKER_ID_BYTES,
    MiB,
    not_storable_text,
    too_long,
    unservable_queue_name,
)
from shardworker.errors import ConfigError

# Failed and cancelled jobs are kept longer than done ones: someone may still look at why.
FAILED_RETENTION_S = 30 * 86400.0
# doctor --horizon-age: a transaction open longer holds the xmin horizon too long (vacuum waits).
HORIZON_WARN_S = 300.0

# The PostgreSQL schema that holds the jobs; an application of its own on a shared database
# names another (--schema, SHARDWORKER_SCHEMA), at most 40 bytes so that its channels
# ("<schema>_finished") stay within PostgreSQL's 63-byte names.
DEFAULT_SCHEMA = "shardworker"
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,39}")


def check_schema(name: object, what: str = "schema") -> str:
    """``name`` when it can name the jobs' schema: lowercase letters, digits and underscores,
    a letter or underscore first, up to 40 characters, and not one of PostgreSQL's own
    (``pg_*``, ``information_schema``, ``public``); ``ConfigError`` saying so otherwise."""
    if not isinstance(name, str) or not _SCHEMA_NAME.fullmatch(name):
        raise ConfigError(f"{what}: {name!r} is not a schema name shardworker takes: lowercase letters, digits and "
                          "underscores, a letter or underscore first, at most 40 characters (like app2)")
    if name.startswith("pg_") or name in ("information_schema", "public"):
        raise ConfigError(f"{what}: {name!r} is PostgreSQL's own schema; name one for the jobs (like app2)")
    return name


def duration_text(seconds: float) -> str:
    """``seconds`` in the largest unit up to days that divides it (1800 -> ``30m``, 604800 -> ``7d``)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def duration_seconds(text: str) -> float | None:
    """Seconds in ``90``, ``90s``, ``30m``, ``2h``, ``7d`` or ``1w``; None when it is not one.
    May exceed the longest duration the commands take (even be infinite): callers refuse that."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhdw]?)", text.strip())
    return float(match[1]) * _UNITS[match[2] or "s"] if match else None


@dataclass(frozen=True, kw_only=True)
class StoreConfig:
    """Connection settings; every wait is bounded so an outage never hangs a loop."""

    dsn: str
    connect_timeout_s: int = 5
    statement_timeout_s: float = 30.0
    # A connection whose peer stops answering (a black hole) is declared dead after about
    # this long, through TCP keepalives and TCP_USER_TIMEOUT, even mid-statement.
    network_timeout_s: int = 20
    application_name: str = "shardworker"
    # A direct connection (not through a transaction pool) used for LISTEN only.
    listen_dsn: str | None = None

    def __post_init__(self) -> None:
        if self.connect_timeout_s < 1:
            raise ValueError("connect_timeout_s must be >= 1")
        if self.statement_timeout_s <= 0:
            raise ValueError("statement_timeout_s must be > 0")
        if self.network_timeout_s < 2:
            raise ValueError("network_timeout_s must be >= 2")


@dataclass(frozen=True, kw_only=True)
class FlusherConfig:
    """The flusher's batches and retries (``WorkerConfig.flusher_config``)."""

    flush_batch: int
    flush_bytes: int
    checkpoint_interval_s: float
    backoff_base_s: float
    backoff_cap_s: float
    embedded_db: bool = False  # the database is the embedded server (recorded in the outbox's binding)
    statement_timeout_s: float = 30.0  # the store's: a batch that takes longer is applied in parts
    rescue_grace_s: float = 300.0  # how long a follow-up inserted again after the database went back waits
    # The applied tail kept for a database that comes back older (WorkerConfig's reapply_*).
    reapply_window_s: float = 0.0
    reapply_max_bytes: int = 0
    min_free_bytes: int = 0


    def keep(self) -> Keep:
        """The applied tail the outbox keeps (``outbox.tail``)."""
        return Keep(self.reapply_window_s, self.reapply_max_bytes, self.min_free_bytes)


@dataclass(frozen=True, kw_only=True)
class ChildConfig:
    """One child process's settings (``WorkerConfig.child_config``)."""

    shard: int
    outbox_dir: str
    app_ref: str
    group_commit_max_delay_s: float
    group_commit_max_records: int
    group_commit_max_bytes: int
    segment_bytes: int
    parent_pid: int
    concurrency: int  # handlers in flight for the threads and async lanes
    slots: int  # the most jobs the parent sends before some are reported
    default_timeout_s: float  # handlers without timeout_s get this one (0: none)


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """Settings of ``shardworker run``."""

    dsn: str
    app_ref: str
    listen_dsn: str | None = None  # run --listen-dsn: a direct connection for LISTEN only
    procs: int = 2
    outbox_dir: str = ".shardworker/outbox"
    queues: tuple[str, ...] | None = None
    worker_id: str | None = None
    exit_when_idle: bool = False
    # Bounds in count and bytes at every stage: see shardworker/core/limits.py for all of them.
    claim_batch: int = 500
    claim_bytes: int = 16 * MiB  # payload bytes per claim (one bigger job comes alone)
    # Handlers in flight per child for async def and threads=True kinds (plain sync
    # handlers run one at a time per child).
    concurrency: int = 10
    # Jobs a child holds beyond what it runs at once: at least prefetch_batch, and more while
    # it finishes jobs fast: about prefetch_horizon_s of its recent rate, up to
    # prefetch_max_jobs. Enough to keep it busy while the next claim is in flight, few
    # enough that a slow handler does not hoard jobs a peer could run.
    prefetch_batch: int = 64
    prefetch_horizon_s: float = 0.1
    prefetch_max_jobs: int = 1000
    # Payload bytes sent to one child and not yet reported (one bigger job goes alone).
    prefetch_bytes: int = 8 * MiB
    # A job sent to a child and not started after this long is taken back for a child with
    # room, when another child is idle or this one finished nothing meanwhile (its handlers
    # are all busy). Long enough that a child working through its prefetch at its usual
    # pace is rarely asked, short enough that no job waits a second behind a stuck handler.
    steal_after_s: float = 0.5
    poll_interval_s: float = 1.0
    group_commit_max_delay_s: float = 0.005
    group_commit_max_records: int = 512
    group_commit_max_bytes: int = 8 * MiB  # outcome bytes a child holds before it commits
    flush_batch: int = 1000
    flush_bytes: int = 16 * MiB  # outcome bytes the flusher reads and applies at once
    flush_idle_sleep_s: float = 0.005
    checkpoint_interval_s: float = 0.2
    # 0.05 s doubling to a 5 s cap: an ended outage is noticed within ~5 s.
    backoff_base_s: float = 0.05
    backoff_cap_s: float = 5.0
    # Outcomes acknowledged but not yet applied before claiming pauses: bounds the rows left
    # running, and the replay work, when the flusher falls behind.
    max_backlog: int = 10_000
    min_free_bytes: int = 64 * MiB
    segment_bytes: int = 16 * MiB
    # Applied outcomes stay in the outbox this long, up to reapply_max_bytes, so that a
    # database that comes back older (a failover to a replica that lagged, a restore) gets
    # them again instead of their jobs running again (shardworker.flusher.marks). 15 minutes
    # covers the lag bounds failover managers allow by default (Patroni's maximum_lag_on_failover
    # is 1 MB of WAL, seconds) many times over, and a restore of the last minutes; 1 GiB holds
    # 15 minutes of about 10 million small outcomes. Below min_free_bytes free, the kept tail goes first.
    reapply_window_s: float = 900.0
    reapply_max_bytes: int = 1024 * MiB
    shutdown_timeout_s: float = 30.0
    # The timeout of every handler without its own timeout_s (0: none). A handler that never
    # returns would hold its child, and the jobs routed to it, forever; 30 minutes is far
    # beyond what a job queue's handler usually takes (seconds to minutes), so only a stuck
    # one reaches it. A kind that needs longer says so with timeout_s=.
    default_timeout_s: float = 1800.0
    # How long a handler an operator cancelled while it runs may take to stop (a sync one
    # polling job.cancelled, an async one catching CancelledError) before its child is
    # stopped the way a timeout stops it.
    cancel_grace_s: float = 10.0
    heartbeat_interval_s: float = 2.0
    # Watched silence before a peer rescues this worker's jobs: an hour, as peers use (1-4 h),
    # so a restart, a blip or a failover never triggers it; only a host gone for longer.
    rescue_after_s: float = 3600.0
    # Watched silence after which this worker's running jobs stop counting toward limits across
    # workers (its peers' claims start others in their slots): five missed heartbeats. The jobs
    # stay its own until the rescue, so a worker merely cut off for a while and back runs
    # them on, over the limit until they end.
    release_slots_after_s: float = 10.0
    # A rescued job waits this long before it may be claimed again: the silent worker's late
    # outcomes of the rescued attempts still land meanwhile instead of the jobs running again.
    rescue_grace_s: float = 300.0
    # Done jobs older than this are pruned; 0 keeps them all.
    retention_s: float = 7 * 86400.0
    # Failed and cancelled jobs older than this are pruned; 0 keeps them all; None: see
    # failed_retention_s.
    retention_failed_s: float | None = None
    prune_interval_s: float = 60.0
    # Events (send_event) are kept this long, whether or not a job waited on them: a wait that
    # starts after its event was sent takes it (shardworker.child.waits).
    event_retention_s: float = 7 * 86400.0
    # A periodic schedule no worker has checked for this long (removed from the code, or every
    # worker that declares it down) leaves `shardworker periodic`, and housekeeping forgets its
    # row: if it comes back, its ticks start afresh instead of catching up.
    periodic_forget_s: float = 86400.0
    connect_timeout_s: int = StoreConfig.connect_timeout_s
    statement_timeout_s: float = StoreConfig.statement_timeout_s
    network_timeout_s: int = StoreConfig.network_timeout_s
    log_interval_s: float = 10.0
    embedded_db: bool = False  # the DSN is the embedded server's (recorded in the outbox's binding)
    # Prometheus text at http://metrics_host:metrics_port/metrics (None: no server); a
    # bearer token is required beyond the loopback interface.
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    metrics_token: str | None = None

    def __post_init__(self) -> None:
        checks = [
            *((name, getattr(self, name) >= 0, "must be >= 0") for name in (
                "prefetch_horizon_s", "steal_after_s", "min_free_bytes", "shutdown_timeout_s", "cancel_grace_s",
                "rescue_grace_s", "reapply_window_s", "reapply_max_bytes")),
            ("procs", self.procs >= 1, "must be >= 1"),
            ("claim_batch", self.claim_batch >= 1, "must be >= 1"),
            ("claim_bytes", self.claim_bytes >= 1, "must be >= 1"),
            ("group_commit_max_bytes", self.group_commit_max_bytes >= 1, "must be >= 1"),
            ("flush_bytes", self.flush_bytes >= 1, "must be >= 1"),
            ("concurrency", self.concurrency >= 1, "must be >= 1"),
            ("prefetch_batch", self.prefetch_batch >= 1, "must be >= 1"),
            ("prefetch_max_jobs", self.prefetch_max_jobs >= 1, "must be >= 1"),
            ("prefetch_bytes", self.prefetch_bytes >= 1024, "must be >= 1024"),
            ("poll_interval_s", self.poll_interval_s > 0, "must be > 0"),
            ("group_commit_max_delay_s", self.group_commit_max_delay_s >= 0, "must be >= 0"),
            ("group_commit_max_records", self.group_commit_max_records >= 1, "must be >= 1"),
            ("flush_batch", self.flush_batch >= 1, "must be >= 1"),
            ("backoff_base_s", 0 < self.backoff_base_s <= self.backoff_cap_s, "must be > 0 and <= backoff_cap_s"),
            ("segment_bytes", self.segment_bytes >= 4096, "must be >= 4096"),
            ("default_timeout_s", 0 <= self.default_timeout_s < float("inf"), "must be >= 0 seconds (0: no limit)"),
            ("heartbeat_interval_s", self.heartbeat_interval_s > 0, "must be > 0"),
            ("rescue_after_s", self.rescue_after_s > 2 * self.heartbeat_interval_s,
             "must be more than twice heartbeat_interval_s"),
            ("release_slots_after_s", self.release_slots_after_s >= 2 * self.heartbeat_interval_s,
             "must be at least twice heartbeat_interval_s"),
            ("rescue_after_s", self.rescue_after_s > self.shutdown_timeout_s,
             "must be longer than shutdown_timeout_s (a stopping worker must never look dead)"),
            ("retention_s", self.retention_s >= 0, "must be >= 0 (0 keeps every finished job)"),
            ("retention_failed_s", (self.retention_failed_s or 0) >= 0,
             "must be >= 0 (0 keeps every failed and cancelled job)"),
            ("prune_interval_s", self.prune_interval_s > 0, "must be > 0"),
            ("event_retention_s", self.event_retention_s > 0, "must be > 0 (events are kept this long)"),
            ("procs", self.procs < PARENT_SHARD, f"must be < {PARENT_SHARD}"),
            ("connect_timeout_s", self.connect_timeout_s >= 1, "must be >= 1"),
            ("statement_timeout_s", self.statement_timeout_s > 0, "must be > 0"),
            ("network_timeout_s", self.network_timeout_s >= 2, "must be >= 2"),
        ]
        for name, ok, why in checks:
            if not ok:
                raise ConfigError(f"{name} {why} (got {getattr(self, name)!r})")
        if self.queues is not None and not all(self.queues):
            raise ConfigError("queues must be non-empty names")
        # Names the database indexes (shardworker.core.limits): refused here, not at the first claim.
        sized = [("queue", q, MAX_QUEUE_BYTES) for q in self.queues or ()]
        if self.worker_id is not None:
            sized.append(("worker_id", self.worker_id, MAX_WORKER_ID_BYTES))
        for field_name, value, limit in sized:
            refusal = too_long(field_name, value, limit) or not_storable_text(field_name, value)
            if refusal or (field_name == "queue" and (refusal := unservable_queue_name(value))):
                raise ConfigError(refusal)

    @property
    def failed_retention_s(self) -> float:
        """How long failed and cancelled jobs are kept: ``retention_failed_s`` when set, else
        ``FAILED_RETENTION_S`` or ``retention_s`` when that is longer (``retention_s`` 0,
        keeping every finished job, keeps these too)."""
        if self.retention_failed_s is not None:
            return self.retention_failed_s
        return 0.0 if self.retention_s == 0 else max(self.retention_s, FAILED_RETENTION_S)

    def at_once(self, concurrent: bool) -> int:
        """Handlers a child runs at once: ``concurrency`` when the app has async or threaded
        kinds, else one."""
        return self.concurrency if concurrent else 1

    def prefetch_jobs(self, concurrent: bool) -> tuple[int, int]:
        """(least, most) jobs a child holds: what it runs at once (``at_once``) plus
        ``prefetch_batch``, or plus ``prefetch_max_jobs`` when it is faster.

        A child running ``concurrency`` async or threaded handlers holds at least twice that
        beyond them (up to the most): its running handlers can all finish within one claim's
        round trip, and the jobs they finished count as held until their outcomes are
        durable, so a prefetch of ``prefetch_batch`` alone leaves handlers without a job at
        every claim until its pace has raised it (``bench/iobound.py``)."""
        at_once = self.at_once(concurrent)
        most = at_once + max(self.prefetch_batch, self.prefetch_max_jobs)
        least = at_once + max(self.prefetch_batch, 2 * at_once if concurrent else 0)
        return min(least, most), most

    @classmethod
    def default(cls, name: str) -> Any:
        """The default of field ``name`` (the command line shows and uses it)."""
        for f in fields(cls):
            if f.name == name:
                return f.default
        raise KeyError(name)

    def store_config(self) -> StoreConfig:
        return StoreConfig(dsn=self.dsn, connect_timeout_s=self.connect_timeout_s,
                           statement_timeout_s=self.statement_timeout_s, network_timeout_s=self.network_timeout_s,
                           listen_dsn=self.listen_dsn)

    def flusher_config(self) -> FlusherConfig:
        return FlusherConfig(flush_batch=self.flush_batch, flush_bytes=self.flush_bytes,
                             checkpoint_interval_s=self.checkpoint_interval_s, backoff_base_s=self.backoff_base_s,
                             backoff_cap_s=self.backoff_cap_s, embedded_db=self.embedded_db,
                             reapply_window_s=self.reapply_window_s, reapply_max_bytes=self.reapply_max_bytes,
                             min_free_bytes=self.min_free_bytes, statement_timeout_s=self.statement_timeout_s,
                             rescue_grace_s=self.rescue_grace_s)

    def child_config(self, shard: int, *, parent_pid: int, slots: int) -> ChildConfig:
        return ChildConfig(shard=shard, outbox_dir=self.outbox_dir, app_ref=self.app_ref,
                           group_commit_max_delay_s=self.group_commit_max_delay_s,
                           group_commit_max_records=self.group_commit_max_records,
                           group_commit_max_bytes=self.group_commit_max_bytes, segment_bytes=self.segment_bytes,
                           parent_pid=parent_pid, concurrency=self.concurrency, slots=slots,
                           default_timeout_s=self.default_timeout_s)
