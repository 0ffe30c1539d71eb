"""The PostgreSQL store: the only module that imports psycopg.

Everything else talks to ``PgStore`` in domain values (``ClaimedJob``, ``Outcome``,
``ApplyResult``) and sees ``shardworker.errors`` exceptions: connection failures become
``DatabaseUnavailable`` (retryable), a missing schema ``SchemaMissing``, data the
database refuses for good ``DataRejected`` (``OutcomeRejected`` for an outcome,
``EnqueueError`` for a job): never retried, never told as an outage.

A store owns one connection, opened lazily and re-opened after a failure. Never share
a store across processes: children get none, and the flusher opens its own after spawn.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import errors as pgerr
from psycopg.pq import TransactionStatus

from shardworker.dsn import redact_dsn
from shardworker.errors import (
    DatabaseUnavailable,
    DataRejected,
    EnqueueError,
    JobsError,
    NotConnected,
    OutcomeRejected,
    SchemaMissing,
    StoreError,
    TransientConflict,
)
from shardworker.model import ApplyResult, ClaimedJob, Outcome
from shardworker.store.config import StoreConfig
from shardworker.store.schema import Migration, latest_version
from shardworker.store.sql import query

log = logging.getLogger(__name__)


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """Turn psycopg errors into shardworker errors at the store boundary."""
    try:
        yield
    except psycopg.Error as exc:
        raise _translate(exc) from exc


def _translate(exc: psycopg.Error) -> StoreError:
    """The shardworker error for a psycopg one. A refusal the server would repeat (a value
    over an index's limit, bad data, a failed check) is ``DataRejected`` before anything
    else: psycopg files program_limit_exceeded under OperationalError, which would
    otherwise read as an outage and be retried forever."""
    if _is_refusal(exc):
        return DataRejected(f"database refused: {_first_line(exc)}")
    if isinstance(exc, pgerr.UndefinedTable | pgerr.InvalidSchemaName | pgerr.UndefinedColumn):
        return SchemaMissing()
    if isinstance(exc, pgerr.SerializationFailure | pgerr.DeadlockDetected | pgerr.QueryCanceled):
        return TransientConflict(f"transient conflict: {exc.diag.message_primary or exc}")
    if isinstance(exc, pgerr.ReadOnlySqlTransaction):
        # A standby, or a primary mid-failover: wait for a writable server as for any outage.
        return DatabaseUnavailable(f"database unavailable: read-only: {_first_line(exc)}")
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return DatabaseUnavailable(f"database unavailable: {_first_line(exc)}")
    return StoreError(f"database error: {_first_line(exc)}")


def _is_refusal(exc: psycopg.Error) -> bool:
    """SQLSTATE class 54 (program limit exceeded), class 22 (data exception) or 23514
    (check violation): the same statement would fail the same way again."""
    state = exc.sqlstate or ""
    return state[:2] in ("54", "22") or state == "23514"


def _tcp_liveness(timeout_s: int) -> dict[str, Any]:
    """libpq options that declare a silent peer dead after about ``timeout_s``:
    keepalive probes start after timeout/2 idle, then 2 probes timeout/4 apart."""
    return {"keepalives": 1, "keepalives_idle": max(1, timeout_s // 2),
            "keepalives_interval": max(1, timeout_s // 4), "keepalives_count": 2,
            "tcp_user_timeout": timeout_s * 1000}


def _connect_options(config: StoreConfig) -> dict[str, Any]:
    """Keyword arguments for ``psycopg.connect``: autocommit, every wait bounded."""
    return {"autocommit": True, "connect_timeout": config.connect_timeout_s,
            # Never server-prepare: a generic plan for the batched apply assumed ~1
            # running row and nested-looped over all of them (seconds per batch).
            "prepare_threshold": None, "application_name": config.application_name,
            "options": f"-c statement_timeout={int(config.statement_timeout_s * 1000)}",
            **_tcp_liveness(config.network_timeout_s)}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return redact_dsn(text[0]) if text else type(exc).__name__


class _Watchdog:
    """A client-side deadline: shuts a connection's socket down when one operation overruns.

    Server-side ``statement_timeout`` needs a server that answers, and TCP keepalives need
    a peer that stops ACKing; neither fires when a middlebox swallows the bytes. Shutting
    the socket down makes the blocked libpq call fail at once, and the store reconnects.
    One daemon thread per store while its connection is open: started on first use,
    stopped (and joined) when the store closes the connection.
    """

    _POLL_S = 0.25  # deadlines are tens of seconds; a quarter second late is fine

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._deadline = 0.0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def arm(self, fd: int, seconds: float) -> None:
        with self._lock:
            self._fd, self._deadline = fd, time.monotonic() + seconds
            if self._thread is None:
                self._stop.clear()
                self._thread = threading.Thread(target=self._watch, name="shardworker-db-deadline", daemon=True)
                self._thread.start()

    def disarm(self) -> None:
        with self._lock:
            self._fd = None

    def stop(self) -> None:
        """End the thread; a later ``arm`` starts a new one."""
        with self._lock:
            thread, self._thread, self._fd = self._thread, None, None
            self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(self._POLL_S):
            # Under the lock: the operation cannot finish (and close or reuse the fd) meanwhile.
            with self._lock:
                if self._fd is None or time.monotonic() < self._deadline:
                    continue
                fd, self._fd = self._fd, None
                log.warning("database operation overran its deadline; dropping the connection")
                with contextlib.suppress(OSError):
                    dup = socket.socket(fileno=os.dup(fd))
                    dup.shutdown(socket.SHUT_RDWR)
                    dup.close()


class PgStore:
    """Job storage on one PostgreSQL connection."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self._conn: psycopg.Connection[Any] | None = None
        self._listening = False
        # Bumped on every new connection: session state (LISTEN, advisory locks) and
        # anything observed through the old session are gone.
        self.generation = 0
        self._watchdog = _Watchdog()
        self._deadline_s = config.statement_timeout_s + config.network_timeout_s

    # connection management -------------------------------------------------

    def connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.close()
            try:
                with translate_errors():
                    self._conn = psycopg.connect(self.config.dsn, **_connect_options(self.config))
            except DatabaseUnavailable as exc:
                raise NotConnected(str(exc)) from exc.__cause__
            self.generation += 1
        return self._conn

    def close(self) -> None:
        """Close the connection and stop its deadline thread; the next call reconnects."""
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn, self._listening = None, False
        self._watchdog.stop()

    @contextlib.contextmanager
    def _cursor(self, *, transaction: bool = False) -> Iterator[psycopg.Cursor[Any]]:
        """A cursor (in a transaction if asked) under the client-side deadline; a broken
        connection is closed so the next call reconnects."""
        try:
            with translate_errors():
                conn = self.connection()
                self._watchdog.arm(conn.fileno(), self._deadline_s)
                try:
                    with conn.transaction() if transaction else contextlib.nullcontext(), conn.cursor() as cur:
                        yield cur
                finally:
                    self._watchdog.disarm()
        except DatabaseUnavailable:
            self.close()
            raise

    # schema ------------------------------------------------------------------

    def migrate(self, migrations: Sequence[Migration]) -> list[str]:
        """Apply those of ``migrations`` not yet applied, in order, each in its own
        transaction, under an advisory lock; returns the names applied."""
        applied: list[str] = []
        with self._cursor() as cur:
            cur.execute(query("migration_lock"))
            try:
                done = self._applied_versions(cur)
                for migration in migrations:
                    if done is None or migration.version not in done:
                        with cur.connection.transaction():
                            cur.execute(migration.sql().encode())
                            cur.execute(query("migration_record"), {"version": migration.version,
                                                                    "name": migration.name})
                        applied.append(migration.name)
            finally:
                cur.execute(query("migration_unlock"))
        return applied

    @staticmethod
    def _applied_versions(cur: psycopg.Cursor[Any]) -> set[int] | None:
        """Versions applied so far; None when the migrations table does not exist."""
        cur.execute(query("migration_table_exists"))
        row = cur.fetchone()
        if not row or not row[0]:
            return None
        cur.execute(query("migration_versions"))
        return {r[0] for r in cur.fetchall()}

    def check_schema(self) -> None:
        """Raise ``SchemaMissing`` unless every migration this code knows is applied."""
        latest = latest_version()
        with self._cursor() as cur:
            done = self._applied_versions(cur)
        if done is None:
            raise SchemaMissing()
        current = max(done, default=None)
        if current is None or current < latest:
            raise SchemaMissing(f"the shardworker schema is at version {current}, "
                                f"the code needs {latest}: run `shardworker migrate`")

    # enqueue -----------------------------------------------------------------

    def enqueue(self, kind: str, payload_json: str, *, queue: str, priority: int, max_attempts: int,
                run_at: datetime | None, delay_s: float, dedupe_key: str | None) -> int | None:
        """Insert one job and notify; its id, or None when the dedupe key is live."""
        with self._cursor() as cur:
            return insert_job(cur, kind, payload_json, queue=queue, priority=priority, max_attempts=max_attempts,
                              run_at=run_at, delay_s=delay_s, dedupe_key=dedupe_key)

    def enqueue_many(self, rows: Iterable[Sequence[Any]]) -> int:
        """COPY rows (kind, queue, payload_json, priority, max_attempts, run_at, dedupe_key)
        in one transaction; returns how many were inserted (dedupe skips the rest)."""
        with self._cursor(transaction=True) as cur:
            return copy_jobs(cur, rows)

    # claiming ----------------------------------------------------------------

    def claim(self, kinds: Sequence[str], queues: Sequence[str] | None, worker_id: str,
              limit: int, claim_token: str | None = None, max_bytes: int = 1 << 62) -> list[ClaimedJob]:
        """Claim up to ``limit`` due jobs and ``max_bytes`` of payload (at least one job when
        any is due): status running, attempt + 1, locked_by worker_id.

        ``claim_token`` tags the claimed rows; if the reply is lost, ``release_claim`` with
        the same token gives back whatever the server did commit.
        """
        params = {"kinds": list(kinds), "queues": list(queues) if queues else None,
                  "worker_id": worker_id, "limit": limit, "claim_token": claim_token, "max_bytes": max_bytes}
        with self._cursor() as cur:
            cur.execute(query("job_claim"), params)
            return [ClaimedJob(*row) for row in cur.fetchall()]

    def release(self, jobs: Sequence[tuple[int, int]], worker_id: str) -> int:
        """Give back (id, attempt) claims whose handler never started."""
        if not jobs:
            return 0
        with self._cursor() as cur:
            cur.execute(query("job_release"), {"ids": [j for j, _ in jobs],
                                               "attempts": [a for _, a in jobs], "worker_id": worker_id})
            return cur.rowcount

    def release_claim(self, claim_token: str, worker_id: str) -> int:
        """Give back the jobs of a claim whose reply was lost; returns how many."""
        with self._cursor() as cur:
            cur.execute(query("job_release_claim"), {"claim_token": claim_token, "worker_id": worker_id})
            return cur.rowcount

    def requeue_orphans(self, worker_id: str, error: str) -> list[int]:
        """Requeue (or fail, when out of attempts) this worker's running jobs."""
        with self._cursor() as cur:
            cur.execute(query("job_requeue_orphans"), {"worker_id": worker_id, "error": error})
            return [r[0] for r in cur.fetchall()]

    def unhandled_kinds(self, kinds: Sequence[str], queues: Sequence[str] | None) -> list[tuple[str, int]]:
        """(kind, queued jobs) of the kinds not in ``kinds``, most first, up to ten."""
        with self._cursor() as cur:
            cur.execute(query("job_unhandled_kinds"), {"kinds": list(kinds),
                                                       "queues": list(queues) if queues else None})
            return [(k, int(n)) for k, n in cur.fetchall()]

    def count_active(self, kinds: Sequence[str], queues: Sequence[str] | None, worker_id: str) -> int:
        """Jobs due now for these kinds, plus jobs running for this worker."""
        with self._cursor() as cur:
            cur.execute(query("job_count_active"), {"kinds": list(kinds),
                                                    "queues": list(queues) if queues else None,
                                                    "worker_id": worker_id})
            row = cur.fetchone()
        return int(row[0]) if row else 0

    # applying outcomes -------------------------------------------------------

    def apply_outcomes(self, outcomes: Sequence[Outcome]) -> ApplyResult:
        """Apply a batch in one fenced statement. Zero-row outcomes are replays or stale."""
        if not outcomes:
            return ApplyResult()
        # Every array goes in binary: results as bytea, the child's JSON bytes unescaped
        # (the statement turns them into jsonb), the rest without text formatting.
        params = {"ids": [o.job_id for o in outcomes], "attempts": [o.attempt for o in outcomes],
                  "codes": [o.code for o in outcomes], "results": [o.result_json for o in outcomes],
                  "errors": [o.error for o in outcomes], "delays": [float(o.retry_delay_s) for o in outcomes]}
        with self._cursor() as cur:
            try:
                cur.execute(query("job_apply_outcomes"), params)
            except psycopg.Error as exc:
                if not _is_refusal(exc):
                    raise
                raise OutcomeRejected(f"outcome rejected: {_first_line(exc)}") from exc
            applied = set(cur.fetchall())
            missed = [o for o in outcomes if (o.job_id, o.attempt) not in applied]
            if not missed:
                return ApplyResult(applied=len(outcomes))
            # Rare: a replay after a lost checkpoint, or a stale attempt. The update above is
            # committed, so this reads the state it left.
            cur.execute(query("job_classify"), {"ids": [o.job_id for o in missed]})
            last_applied = dict(cur.fetchall())
        return _classify(len(outcomes) - len(missed), missed, last_applied)

    # notifications -----------------------------------------------------------

    @property
    def listening(self) -> bool:
        """Whether this connection is subscribed to enqueue notifications."""
        return self._listening

    def listen(self) -> None:
        """Subscribe this connection to enqueue notifications."""
        with self._cursor() as cur:
            cur.execute(query("listen_jobs"))
        self._listening = True

    def notify_fileno(self) -> int:
        """A descriptor that becomes readable when an enqueue notification may have arrived
        (subscribing first); then call ``wait_notify(0)``."""
        if not self._listening:
            self.listen()
        with translate_errors():
            return self.connection().fileno()

    def wait_notify(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for an enqueue notification; True if one came."""
        if not self._listening:
            self.listen()
        conn = self.connection()
        with translate_errors():
            got = any(True for _ in conn.notifies(timeout=0, stop_after=1000))
            if got:
                return True
            ready, _, _ = select.select([conn.fileno()], [], [], timeout_s)
            return bool(ready) and any(True for _ in conn.notifies(timeout=0, stop_after=1000))

    # stats, heartbeats, rescue ----------------------------------------------

    def stats(self) -> list[tuple[str, str, int]]:
        """(queue, status, count) rows."""
        with self._cursor() as cur:
            cur.execute(query("job_stats"))
            return [(q, s, int(n)) for q, s, n in cur.fetchall()]

    def delete_queue(self, queue: str) -> int:
        """Delete every job of ``queue``, whatever its status; how many."""
        with self._cursor() as cur:
            cur.execute(query("queue_delete"), {"queue": queue})
            return cur.rowcount

    def job_counts(self, exact_up_to: int = 1_000_000) -> tuple[list[tuple[str, str, int]], bool]:
        """(queue, status, count) rows, and whether ``done`` is an estimate.

        Exact while the table holds up to ``exact_up_to`` rows (the planner's estimate).
        Above that, every status but ``done`` is still counted exactly through its partial
        index, and ``done`` per queue is the planner's share of rows in that queue (from
        ANALYZE's statistics) minus the exact counts: no statement reads the whole table.
        """
        with self._cursor() as cur:
            cur.execute(query("job_table_size"))
            row = cur.fetchone()
            size = int(row[0]) if row else 0
            if size <= exact_up_to:
                cur.execute(query("job_stats"))
                return [(q, st, int(n)) for q, st, n in cur.fetchall()], False
            cur.execute(query("job_stats_unfinished"))
            rows = [(q, st, int(n)) for q, st, n in cur.fetchall()]
            cur.execute(query("job_queue_shares"))
            shares = {q: float(f) for q, f in cur.fetchall()}
        others: dict[str, int] = {}
        for q, _, n in rows:
            others[q] = others.get(q, 0) + n
        for q, share in shares.items():
            rows.append((q, "done", max(0, round(size * share) - others.get(q, 0))))
        return sorted(rows), True

    def prune_batch(self, older_than_s: float, limit: int) -> int | None:
        """Delete up to ``limit`` jobs finished more than ``older_than_s`` ago; how many, or
        None when another worker is pruning (the lock is per batch, in its transaction)."""
        with self._cursor(transaction=True) as cur:
            cur.execute(query("prune_lock"))
            row = cur.fetchone()
            if not (row and row[0]):
                return None
            cur.execute(query("prune_batch"), {"older_than_s": float(older_than_s), "limit": limit})
            return cur.rowcount

    def run_periodic(self, name: str, schedule: str,
                     plan: Callable[[datetime, datetime | None], tuple[list[dict[str, Any]], datetime]]) -> int:
        """Enqueue a schedule's due ticks, once across workers: lock its row (created on
        first sight), ask ``plan(db_now, last_tick)`` for the jobs to insert (``insert_job``
        keyword arguments) and the new last tick, insert them and record it, in one
        transaction. How many jobs were inserted (a live dedupe key skips one)."""
        with self._cursor(transaction=True) as cur:
            cur.execute(query("periodic_claim"), {"name": name, "schedule": schedule})
            row = cur.fetchone()
            assert row is not None
            last_tick, now = row
            jobs, new_last = plan(now, last_tick)
            inserted = sum(1 for fields in jobs if insert_job(cur, **fields) is not None)
            cur.execute(query("periodic_advance"), {"name": name, "last_tick": new_last})
            return inserted

    def periodic_state(self) -> list[tuple[str, str, datetime | None, datetime]]:
        """(name, schedule, last tick, updated at) of every schedule seen."""
        with self._cursor() as cur:
            cur.execute(query("periodic_list"))
            return list(cur.fetchall())

    def heartbeat(self, worker_id: str, hostname: str, pid: int, running: int | None = None,
                  pending: int | None = None, *, take_over: bool = True) -> tuple[str, int] | None:
        """Beat for ``worker_id`` as (hostname, pid); None when written, else the (hostname,
        pid) of the other process whose row it left alone (only without ``take_over``)."""
        with self._cursor() as cur:
            cur.execute(query("worker_heartbeat"), {"worker_id": worker_id, "hostname": hostname, "pid": pid,
                                                    "running": running, "pending": pending,
                                                    "take_over": take_over})
            row = cur.fetchone()
        if row is None or row[0]:
            return None
        return str(row[1] or "an unknown host"), int(row[2] or 0)  # a row committed after our snapshot

    def worker_row(self, worker_id: str) -> tuple[str, int, datetime] | None:
        """(hostname, pid, heartbeat_at) of ``worker_id``'s heartbeat row; None without one."""
        with self._cursor() as cur:
            cur.execute(query("worker_get"), {"worker_id": worker_id})
            row = cur.fetchone()
        return None if row is None else (str(row[0]), int(row[1]), row[2])

    def workers(self) -> list[dict[str, Any]]:
        """Every worker's row: id, host, pid, started, last heartbeat, load, seconds silent."""
        with self._cursor() as cur:
            cur.execute(query("worker_list"))
            names = [d.name for d in cur.description or []]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def forget_worker(self, worker_id: str, hostname: str, pid: int) -> None:
        """Remove the heartbeat row this (hostname, pid) wrote, unless jobs still run under the id."""
        with self._cursor() as cur:
            cur.execute(query("worker_forget"), {"worker_id": worker_id, "hostname": hostname, "pid": pid})

    def release_worker(self, worker_id: str, hostname: str, pid: int) -> None:
        """The end of a drain that beat under ``worker_id``: remove its row as ``forget_worker``
        does, or leave it naming no process (pid 0) while jobs still run under the id."""
        with self._cursor() as cur:
            cur.execute(query("worker_release"), {"worker_id": worker_id, "hostname": hostname, "pid": pid})

    def try_rescue_lock(self) -> bool:
        """Take (or confirm) the cluster-wide rescuer lock on this connection."""
        with self._cursor() as cur:
            cur.execute(query("rescue_lock"))
            row = cur.fetchone()
        return bool(row and row[0])

    def heartbeats(self) -> dict[str, datetime]:
        with self._cursor() as cur:
            cur.execute(query("worker_heartbeats"))
            return {w: t for w, t in cur.fetchall()}

    def rescue_workers(self, observed: Sequence[tuple[str, datetime]], grace_s: float = 0.0) -> list[int]:
        """Requeue the running jobs of workers whose heartbeat is still the one observed (and
        drop their rows); rescued jobs wait ``grace_s`` before they may be claimed again."""
        with self._cursor() as cur:
            cur.execute(query("rescue_workers"), {"worker_ids": [w for w, _ in observed],
                                                  "heartbeats": [b for _, b in observed], "grace_s": grace_s})
            return [r[0] for r in cur.fetchall()]

    def identity(self) -> tuple[str, str, str]:
        """(instance id, database name, server as host:port): what an outbox is bound to."""
        with self._cursor() as cur:
            cur.execute(query("db_identity"))
            row = cur.fetchone()
            info = cur.connection.info
        if row is None:
            raise SchemaMissing("the shardworker.instance row is missing: run `shardworker migrate`")
        return str(row[0]), str(row[1]), f"{info.host}:{info.port}"

    def requeue_lost(self, worker_id: str, error: str, keep_ids: Sequence[int]) -> list[int]:
        """Requeue this worker's running jobs except ``keep_ids`` (whose outcomes are still coming)."""
        with self._cursor() as cur:
            cur.execute(query("job_requeue_lost"), {"worker_id": worker_id, "error": error,
                                                    "keep_ids": list(keep_ids)})
            return [r[0] for r in cur.fetchall()]

    # doctor --- read-only probes for `shardworker doctor` (shardworker.doctor); nothing written

    def schema_versions(self) -> set[int] | None:
        """Migration versions recorded as applied; None when the ledger table does not exist."""
        with self._cursor() as cur:
            return self._applied_versions(cur)

    def server_state(self) -> ServerState:
        """The server's clock (bracketed by local times around the round trip) and whether
        it accepts writes; reads settings only, so it leaves nothing behind."""
        with self._cursor() as cur:
            sent = time.time()
            cur.execute(query("doctor_server_state"))
            received = time.time()
            row = cur.fetchone()
        assert row is not None
        return ServerState(row[0].timestamp(), sent, received, bool(row[1]), bool(row[2]))


@dataclass(frozen=True)
class ServerState:
    """What ``PgStore.server_state`` saw: the server's clock and local clocks around the query
    (epoch seconds), and whether it is a standby or read-only."""

    server_time: float
    sent_at: float
    received_at: float
    in_recovery: bool
    read_only: bool


# enqueue on any connection: the store's own, or one the caller lends -------------------


def insert_job(cur: psycopg.Cursor[Any], kind: str, payload_json: str, **fields: Any) -> int | None:
    """Insert one job and notify workers (at commit); its id, or None when the dedupe key is live."""
    try:
        cur.execute(query("job_insert"), {"kind": kind, "payload": payload_json, **fields})
    except (psycopg.DataError, psycopg.IntegrityError, pgerr.ProgramLimitExceeded) as exc:
        raise EnqueueError(f"job rejected: {_first_line(exc)}") from exc
    row = cur.fetchone()
    return None if row is None else int(row[0])


def copy_jobs(cur: psycopg.Cursor[Any], rows: Iterable[Sequence[Any]]) -> int:
    """COPY rows into a staging table and move them into the jobs table; must run inside a
    transaction. The staging table is dropped before returning, so a caller's transaction
    may do this again."""
    cur.execute(query("job_stage_create"))
    try:
        with cur.copy(query("job_stage_copy")) as copy:
            for values in rows:
                copy.write_row(values)
        cur.execute(query("job_stage_insert"))
    except (psycopg.DataError, psycopg.IntegrityError, pgerr.ProgramLimitExceeded) as exc:
        raise EnqueueError(f"bulk enqueue rejected: {_first_line(exc)}") from exc
    inserted = cur.fetchone()
    cur.execute(query("job_stage_drop"))
    cur.execute(query("notify_jobs"))
    return int(inserted[0]) if inserted else 0


@contextlib.contextmanager
def borrowed_cursor(conn: Any, *, transaction: bool) -> Iterator[psycopg.Cursor[Any]]:
    """A cursor on a connection the caller owns, which is never closed or reconnected here.

    Inside the caller's open transaction the work joins it (commit or rollback is theirs).
    With none open, work that needs a transaction, or any work on a non-autocommit
    connection, runs in a transaction of its own, committed before returning: the caller
    is never left inside a transaction it did not open. No deadline thread: the caller
    owns the connection's timeouts.
    """
    if isinstance(conn, psycopg.AsyncConnection):
        raise EnqueueError("this is a psycopg.AsyncConnection: use `await enqueue_async(...)` "
                           "or `await enqueue_many_async(...)`")
    if not isinstance(conn, psycopg.Connection):
        raise EnqueueError(f"expected a DSN string or an open psycopg connection, got {type(conn).__name__}")
    own = _needs_own_transaction(conn, transaction)
    with translate_errors(), conn.transaction() if own else contextlib.nullcontext(), conn.cursor() as cur:
        yield cur


def _needs_own_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], transaction: bool) -> bool:
    """Whether work on a borrowed connection must open (and commit) a transaction of its own."""
    if conn.closed:
        raise DatabaseUnavailable("database unavailable: the connection is closed")
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise EnqueueError("the connection's transaction has failed: roll it back before enqueueing")
    return status == TransactionStatus.IDLE and (transaction or not conn.autocommit)


def enqueue_on(conn: Any, kind: str, payload_json: str, **fields: Any) -> int | None:
    """``insert_job`` on a borrowed connection (see ``borrowed_cursor``)."""
    with borrowed_cursor(conn, transaction=False) as cur:
        return insert_job(cur, kind, payload_json, **fields)


def enqueue_many_on(conn: Any, rows: Iterable[Sequence[Any]]) -> int:
    """``copy_jobs`` on a borrowed connection (see ``borrowed_cursor``)."""
    with borrowed_cursor(conn, transaction=True) as cur:
        return copy_jobs(cur, rows)


# the same on an asyncio connection (shardworker.enqueue_async) ---------------------------


@contextlib.asynccontextmanager
async def borrowed_async_cursor(aconn: Any, *, transaction: bool) -> AsyncIterator[psycopg.AsyncCursor[Any]]:
    """``borrowed_cursor`` for a ``psycopg.AsyncConnection``: the same transaction rules."""
    if isinstance(aconn, psycopg.Connection):
        raise EnqueueError("this is a sync psycopg connection: call enqueue() or enqueue_many(), "
                           "or pass a psycopg.AsyncConnection")
    if not isinstance(aconn, psycopg.AsyncConnection):
        raise EnqueueError(f"expected a DSN string or an open psycopg.AsyncConnection, got {type(aconn).__name__}")
    own = _needs_own_transaction(aconn, transaction)
    with translate_errors():
        async with aconn.transaction() if own else contextlib.nullcontext(), aconn.cursor() as cur:
            yield cur


@contextlib.asynccontextmanager
async def async_cursor_for(conn_or_dsn: Any, *, transaction: bool,
                           config: StoreConfig | None = None) -> AsyncIterator[psycopg.AsyncCursor[Any]]:
    """A cursor on the caller's async connection, or on one of its own to a DSN, opened
    with the store's bounds (connect and statement timeouts, TCP liveness) and closed here."""
    if not isinstance(conn_or_dsn, str):
        async with borrowed_async_cursor(conn_or_dsn, transaction=transaction) as cur:
            yield cur
        return
    config = config or StoreConfig(conn_or_dsn)
    with translate_errors():
        aconn = await psycopg.AsyncConnection.connect(config.dsn, **_connect_options(config))
    try:
        async with borrowed_async_cursor(aconn, transaction=transaction) as cur:
            yield cur
    finally:
        await aconn.close()


async def insert_job_async(cur: psycopg.AsyncCursor[Any], kind: str, payload_json: str, **fields: Any) -> int | None:
    """``insert_job`` on an async cursor."""
    try:
        await cur.execute(query("job_insert"), {"kind": kind, "payload": payload_json, **fields})
    except (psycopg.DataError, psycopg.IntegrityError, pgerr.ProgramLimitExceeded) as exc:
        raise EnqueueError(f"job rejected: {_first_line(exc)}") from exc
    row = await cur.fetchone()
    return None if row is None else int(row[0])


async def copy_jobs_async(cur: psycopg.AsyncCursor[Any], rows: Iterable[Sequence[Any]]) -> int:
    """``copy_jobs`` on an async cursor; must run inside a transaction."""
    await cur.execute(query("job_stage_create"))
    try:
        async with cur.copy(query("job_stage_copy")) as copy:
            for values in rows:
                await copy.write_row(values)
        await cur.execute(query("job_stage_insert"))
    except (psycopg.DataError, psycopg.IntegrityError, pgerr.ProgramLimitExceeded) as exc:
        raise EnqueueError(f"bulk enqueue rejected: {_first_line(exc)}") from exc
    inserted = await cur.fetchone()
    await cur.execute(query("job_stage_drop"))
    await cur.execute(query("notify_jobs"))
    return int(inserted[0]) if inserted else 0


async def enqueue_async_on(conn_or_dsn: Any, kind: str, payload_json: str, **fields: Any) -> int | None:
    async with async_cursor_for(conn_or_dsn, transaction=False) as cur:
        return await insert_job_async(cur, kind, payload_json, **fields)


async def enqueue_many_async_on(conn_or_dsn: Any, rows: Iterable[Sequence[Any]]) -> int:
    # Bulk loads may take minutes: no 30 s statement timeout on a connection of our own.
    config = StoreConfig(conn_or_dsn, statement_timeout_s=3600.0) if isinstance(conn_or_dsn, str) else None
    async with async_cursor_for(conn_or_dsn, transaction=True, config=config) as cur:
        return await copy_jobs_async(cur, rows)


def _classify(applied: int, missed: Sequence[Outcome], last_applied: dict[int, int | None]) -> ApplyResult:
    replayed = 0
    stale: list[int] = []
    missing: list[int] = []
    for outcome in missed:
        if outcome.job_id not in last_applied:
            missing.append(outcome.job_id)  # no such job here: the wrong database, or deleted
        elif last_applied[outcome.job_id] == outcome.attempt:
            replayed += 1  # this attempt's outcome was applied before: a replay after a lost checkpoint
        else:
            stale.append(outcome.job_id)  # its attempt was rescued and claimed again
    return ApplyResult(applied, replayed, len(stale), tuple(stale), tuple(missing))


# operator commands on jobs (shardworker.jobs) --------------------------------------------

JOB_COLUMNS = ("id", "kind", "queue", "status", "attempt", "max_attempts", "priority", "payload", "result",
               "last_error", "created_at", "run_at", "attempted_at", "finished_at", "locked_by")


@contextlib.contextmanager
def cursor_for(conn_or_dsn: Any, *, transaction: bool) -> Iterator[psycopg.Cursor[Any]]:
    """A cursor on the caller's connection (see ``borrowed_cursor``) or on a connection of
    its own to a DSN, opened and closed here."""
    if not isinstance(conn_or_dsn, str):
        with borrowed_cursor(conn_or_dsn, transaction=transaction) as cur:
            yield cur
        return
    store = PgStore(StoreConfig(conn_or_dsn))
    try:
        with store._cursor(transaction=transaction) as cur:
            yield cur
    finally:
        store.close()


def list_jobs(cur: psycopg.Cursor[Any], *, statuses: Sequence[str] | None, kind: str | None, queue: str | None,
              since: datetime | None, limit: int) -> list[dict[str, Any]]:
    cur.execute(query("job_list"), {"statuses": list(statuses) if statuses else None, "kind": kind,
                                    "queue": queue, "since": since, "limit": limit})
    return [dict(zip(JOB_COLUMNS, row, strict=True)) for row in cur.fetchall()]


def get_job(cur: psycopg.Cursor[Any], job_id: int) -> dict[str, Any] | None:
    cur.execute(query("job_get"), {"id": job_id})
    row = cur.fetchone()
    return None if row is None else dict(zip(JOB_COLUMNS, row, strict=True))


def lock_jobs(cur: psycopg.Cursor[Any], job_ids: Sequence[int]) -> dict[int, str]:
    """Status of each of ``job_ids`` that exists, locked until the transaction ends."""
    cur.execute(query("job_lock_for_change"), {"ids": list(job_ids)})
    return {int(i): str(s) for i, s in cur.fetchall()}


def failed_job_ids(cur: psycopg.Cursor[Any], kind: str | None, queue: str | None) -> list[int]:
    cur.execute(query("job_failed_ids"), {"kind": kind, "queue": queue})
    return [int(r[0]) for r in cur.fetchall()]


def change_jobs(cur: psycopg.Cursor[Any], action: str, job_ids: Sequence[int]) -> int:
    """Run ``job_retry``, ``job_cancel`` or ``job_delete`` on ``job_ids``; rows changed."""
    cur.execute(query(f"job_{action}"), {"ids": list(job_ids)})
    return cur.rowcount


FINAL_STATUSES = ("done", "failed", "cancelled")


def wait_job_end(conn_or_dsn: Any, job_id: int, timeout_s: float) -> tuple[dict[str, Any] | None, bool]:
    """The job's row once it is done, failed or cancelled (or gone), and True; or its row
    when ``timeout_s`` ran out first, and False.

    It LISTENs on ``shardworker_finished`` before reading the row, so an end committed
    between the read and the wait still wakes it: a notification that arrives while a
    statement runs waits in psycopg's backlog for ``notifies()``. On the caller's connection
    (outside a transaction: notifications arrive only between transactions) each
    statement is committed at once when it is not in autocommit, and the subscription is
    undone before returning.
    """
    borrowed = not isinstance(conn_or_dsn, str)
    if borrowed:
        conn = _idle_connection(conn_or_dsn)
    else:
        store = PgStore(StoreConfig(conn_or_dsn))
        with translate_errors():
            conn = store.connection()
    def run(name: str, params: dict[str, Any] | None = None) -> tuple[Any, ...] | None:
        cur = conn.execute(query(name), params)
        row = cur.fetchone() if cur.description else None
        if not conn.autocommit:
            conn.commit()
        return row

    def ended(notify: psycopg.Notify) -> bool:
        return notify.channel == "shardworker_finished" and str(job_id) in notify.payload.split(",")

    deadline = time.monotonic() + max(0.0, timeout_s)
    try:
        with translate_errors():
            run("listen_finished")
            while True:
                row = run("job_get", {"id": job_id})
                job = None if row is None else dict(zip(JOB_COLUMNS, row, strict=True))
                if job is None or job["status"] in FINAL_STATUSES:
                    return job, True
                woken = False
                while not woken:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return job, False
                    woken = any(ended(n) for n in conn.notifies(timeout=remaining, stop_after=1))
    finally:
        if borrowed:
            with contextlib.suppress(psycopg.Error):
                run("unlisten_finished")
        else:
            store.close()


def _idle_connection(conn: Any) -> psycopg.Connection[Any]:
    if not isinstance(conn, psycopg.Connection):
        raise EnqueueError(f"expected a DSN string or an open psycopg connection, got {type(conn).__name__}")
    if conn.closed:
        raise DatabaseUnavailable("database unavailable: the connection is closed")
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise JobsError("wait_for needs a connection outside a transaction: PostgreSQL delivers "
                        "notifications only between transactions")
    return conn


# dashboard ---------------------------------------------------------------------------------
# Read-only queries for `shardworker dashboard`, on a connection or a DSN like the jobs API.

def dashboard_kind_counts(conn_or_dsn: Any) -> list[tuple[str, str, str, int]]:
    """(queue, kind, status, count) rows: every unfinished, failed and cancelled job, and
    ``done_1h`` for jobs done in the last hour (no statement reads the whole table)."""
    with cursor_for(conn_or_dsn, transaction=False) as cur:
        cur.execute(query("dashboard_kind_counts"))
        return [(str(q), str(k), str(s), int(n)) for q, k, s, n in cur.fetchall()]


def dashboard_finished_per_minute(conn_or_dsn: Any) -> list[tuple[datetime, int, int]]:
    """(minute, done, failed) for each of the last 60 minutes, oldest first, zeros included."""
    with cursor_for(conn_or_dsn, transaction=False) as cur:
        cur.execute(query("dashboard_finished_per_minute"))
        return [(m, int(d), int(f)) for m, d, f in cur.fetchall()]
