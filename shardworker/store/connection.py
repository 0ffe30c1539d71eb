"""One PostgreSQL connection and the rules around it: how it is opened (every wait bounded),
the client-side deadline that drops a connection whose peer went silent, and how psycopg
errors become ``shardworker.errors``: connection failures ``DatabaseUnavailable``
(retryable), a missing schema ``SchemaMissing``, data the database refuses for good
``DataRejected``; never retried, never told as an outage.

``Session`` owns one connection, opened lazily and re-opened after a failure; the store's
query classes build on it. Never share one across processes (children have none).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, Self

import psycopg
from psycopg import errors as pgerr
from psycopg.pq import TransactionStatus

from shardworker.core.config import DEFAULT_SCHEMA, StoreConfig
from shardworker.core.dsn import redact_dsn
from shardworker.errors import (
    DatabaseUnavailable,
    DatabaseWentBack,
    DataRejected,
    NotConnected,
    SchemaMissing,
    StatementTimeout,
    StoreError,
    TransientConflict,
)
from shardworker.store.plans import Plans
from shardworker.store.sql import current_schema

log = logging.getLogger(__name__)


def _not_pipeline_exit_noise(record: logging.LogRecord) -> bool:
    """psycopg warns when closing a pipeline fails behind an error its block already raised
    (a connection lost mid-batch); that error reaches the caller, whose outage is told once."""
    return not str(record.msg).startswith("error ignored terminating")


logging.getLogger("psycopg").addFilter(_not_pipeline_exit_noise)


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """Turn psycopg errors into shardworker errors at the store boundary."""
    try:
        yield
    except psycopg.Error as exc:
        raise translate(exc) from exc


def migrate_command() -> str:
    """The command that migrates the schema in use: ``shardworker migrate [--schema NAME]``."""
    schema = current_schema()
    return "shardworker migrate" + ("" if schema == DEFAULT_SCHEMA else f" --schema {schema}")


def schema_missing() -> str:
    """What to do when the schema in use is missing or behind, naming it."""
    schema = current_schema()
    named = "the shardworker schema" if schema == DEFAULT_SCHEMA else f"schema {schema}"
    return f"{named} is missing or out of date: run `{migrate_command()}`"


def translate(exc: psycopg.Error) -> StoreError:
    """The shardworker error for a psycopg one. A refusal the server would repeat (a value
    over an index's limit, bad data, a failed check) is ``DataRejected`` before anything
    else: psycopg files program_limit_exceeded under OperationalError, which would
    otherwise read as an outage and be retried forever."""
    if exc.sqlstate == WENT_BACK:
        return DatabaseWentBack(first_line(exc))
    if is_refusal(exc):
        return DataRejected(f"database refused: {first_line(exc)}")
    if isinstance(exc, pgerr.UndefinedTable | pgerr.InvalidSchemaName | pgerr.UndefinedColumn):
        return SchemaMissing(schema_missing())
    schema = current_schema()
    if isinstance(exc, pgerr.UndefinedFunction) and any(
            f"{name}." in (exc.diag.message_primary or "") for name in (f" {schema}", f' "{schema}"')):
        return SchemaMissing(schema_missing())  # a function of a newer migration: the library was upgraded first
    if isinstance(exc, pgerr.QueryCanceled) and "statement timeout" in str(exc):
        return StatementTimeout(f"statement timeout: {first_line(exc)}")
    if isinstance(exc, pgerr.SerializationFailure | pgerr.DeadlockDetected | pgerr.QueryCanceled):
        return TransientConflict(f"transient conflict: {exc.diag.message_primary or exc}")
    if isinstance(exc, pgerr.ReadOnlySqlTransaction):
        # A standby, or a primary mid-failover: wait for a writable server as for any outage.
        return DatabaseUnavailable(f"database unavailable: read-only: {first_line(exc)}")
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return DatabaseUnavailable(f"database unavailable: {first_line(exc)}")
    return StoreError(f"database error: {first_line(exc)}")


WENT_BACK = "SWR01"  # raised by shardworker.outbox_mark (migration 0015): the database went back in time


def is_refusal(exc: psycopg.Error) -> bool:
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


def connect_options(config: StoreConfig, *, startup_options: bool = True) -> dict[str, Any]:
    """Keyword arguments for ``psycopg.connect``: autocommit, every wait bounded.
    Without ``startup_options`` the ``options`` startup parameter (the server-side
    statement timeout) is left out, for poolers that refuse it."""
    options = {"autocommit": True, "connect_timeout": config.connect_timeout_s,
               # Never server-prepare by count: a transaction pool (PgBouncer) hands each
               # statement a different server connection, where a statement prepared on
               # another one does not exist. The worker's hot statements ask (Session.prepares).
               "prepare_threshold": None, "application_name": config.application_name,
               **_tcp_liveness(config.network_timeout_s)}
    if startup_options and config.dsn not in _REFUSE_OPTIONS:
        options["options"] = f"-c statement_timeout={int(config.statement_timeout_s * 1000)}"
    return options

# DSNs whose server refused the ``options`` startup parameter: PgBouncer (before 1.20
# without ``ignore_startup_parameters = options``) closes such a connection at once.
_REFUSE_OPTIONS: set[str] = set()
_OPTIONS_REFUSED = "unsupported startup parameter: options"


def refuses_options(exc: psycopg.Error, config: StoreConfig) -> bool:
    """Whether ``exc`` is a pooler refusing the ``options`` startup parameter; if so,
    remember it for ``config.dsn`` and say once that the statement timeout is left to the
    client-side deadline (``Watchdog``) there."""
    if _OPTIONS_REFUSED not in str(exc) or config.dsn in _REFUSE_OPTIONS:
        return False
    _REFUSE_OPTIONS.add(config.dsn)
    log.debug("the database's pooler refuses the options startup parameter: connecting without "
             "statement_timeout; a statement past %.0f s is cut by the client-side deadline instead",
             config.statement_timeout_s + config.network_timeout_s)
    return True


def connect(config: StoreConfig) -> psycopg.Connection[Any]:
    """A new connection for ``config``; once more without the ``options`` startup
    parameter when a pooler refuses it."""
    try:
        return psycopg.connect(config.dsn, **connect_options(config))
    except psycopg.OperationalError as exc:
        if not refuses_options(exc, config):
            raise
    return psycopg.connect(config.dsn, **connect_options(config, startup_options=False))


async def connect_async(config: StoreConfig) -> psycopg.AsyncConnection[Any]:
    """``connect`` for asyncio."""
    try:
        return await psycopg.AsyncConnection.connect(config.dsn, **connect_options(config))
    except psycopg.OperationalError as exc:
        if not refuses_options(exc, config):
            raise
    return await psycopg.AsyncConnection.connect(config.dsn, **connect_options(config, startup_options=False))


class UnpreparedCursor(psycopg.Cursor[Any]):
    """A cursor for a caller's own connection that never server-prepares, whatever the
    connection's ``prepare_threshold`` (psycopg's default prepares a statement on its 5th
    run): behind a transaction pool (PgBouncer) each statement may meet another server
    connection, which lacks the statement or holds another client's of the same name."""

    def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None,
                binary: bool | None = None) -> Self:
        return super().execute(query, params, prepare=False, binary=binary)


class AsyncUnpreparedCursor(psycopg.AsyncCursor[Any]):
    """``UnpreparedCursor`` for asyncio."""

    async def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None,
                      binary: bool | None = None) -> Self:
        return await super().execute(query, params, prepare=False, binary=binary)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return redact_dsn(text[0]) if text else type(exc).__name__


class Watchdog:
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


class Session:
    """One PostgreSQL connection, opened on first use and re-opened after a failure."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self._conn: psycopg.Connection[Any] | None = None
        self._listening = False
        self._cancelled: set[tuple[int, int | None]] = set()  # shardworker_cancel (job id, attempt) not yet taken
        # Bumped on every new connection: session state (LISTEN, advisory locks) and
        # anything observed through the old session are gone.
        self.generation = 0
        self._watchdog = Watchdog()
        self._deadline_s = config.statement_timeout_s + config.network_timeout_s
        self._plans = Plans()

    def connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.close()
            try:
                with translate_errors():
                    self._conn = connect(self.config)
            except DatabaseUnavailable as exc:
                raise NotConnected(str(exc)) from exc.__cause__
            self.generation += 1
        return self._conn

    def prepares(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether the worker's hot statements run prepared on ``conn`` (``shardworker.store.plans``)."""
        return self._plans.prepares(conn, self.generation)

    def close(self) -> None:
        """Close the connection and stop its deadline thread; the next call reconnects."""
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn, self._listening = None, False
        self._watchdog.stop()

    @contextlib.contextmanager
    def cursor(self, *, transaction: bool = False, timeout_s: float | None = None) -> Iterator[psycopg.Cursor[Any]]:
        """A cursor (in a transaction if asked) under the client-side deadline (that of a
        statement timeout of ``timeout_s``, which the caller sets, when given); a broken
        connection is closed so the next call reconnects."""
        deadline_s = self._deadline_s if timeout_s is None else timeout_s + self.config.network_timeout_s
        try:
            with translate_errors():
                conn = self.connection()
                self._watchdog.arm(conn.fileno(), deadline_s)
                try:
                    with conn.transaction() if transaction else contextlib.nullcontext(), conn.cursor() as cur:
                        yield cur
                finally:
                    self._watchdog.disarm()
        except DatabaseUnavailable:
            self.close()
            raise


def rollback(conn: psycopg.Connection[Any]) -> None:
    """End a transaction a failed statement left open (nothing to do in autocommit)."""
    if conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
        with contextlib.suppress(psycopg.Error):
            conn.execute("ROLLBACK")
