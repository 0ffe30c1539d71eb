"""The worker's notifications: enqueues (``shardworker_jobs``) wake the dispatcher, and the
cancels of running jobs (``shardworker_cancel``, sent by ``job_cancel``) are kept for
``take_cancelled``. They arrive on the claim connection, or on a direct connection of their
own when ``StoreConfig.listen_dsn`` is set (``run --listen-dsn``).

LISTEN cannot work through a transaction pool (PgBouncer's ``pool_mode = transaction``): the
server connection that ran it goes back to the pool, and a notification reaches whoever
holds that connection next, or no one. So the first LISTEN checks: when the connection's
backend pid (from its startup) is not the pid its server reports, a pooler sits between,
and a NOTIFY sent from another connection must come back within ``PROBE_WAIT_S``. When it
does not, the worker says so once and polls."""

from __future__ import annotations

import logging
import select
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import psycopg

from shardworker.core.records import CancelKey
from shardworker.store.connection import Session, connect, translate_errors
from shardworker.store.sql import channel, query

log = logging.getLogger(__name__)

PROBE_WAIT_S = 1.0


class Notifications(Session):
    """LISTEN on the worker's connection (or its listen connection), and what arrives."""

    _listener_session: Session | None = None
    _polls: bool | None = None  # None until the first LISTEN found out

    @property
    def listening(self) -> bool:
        """Whether this worker is subscribed to enqueue notifications."""
        return self._listener()._listening

    @property
    def polls(self) -> bool:
        """True once the first LISTEN found that notifications cannot reach this worker."""
        return bool(self._polls)

    def _listener(self) -> Session:
        """The session that LISTENs: with ``listen_dsn`` a direct one of its own, else this one."""
        if not self.config.listen_dsn:
            return self
        if self._listener_session is None:
            self._listener_session = Session(replace(self.config, dsn=self.config.listen_dsn, listen_dsn=None,
                                                     application_name=f"{self.config.application_name} listen"))
        return self._listener_session

    def close(self) -> None:
        super().close()
        if self._listener_session is not None:
            self._listener_session.close()

    def listen(self) -> None:
        """Subscribe to enqueue and cancel notifications; the first time, find out whether
        they can arrive at all (else say once that this worker polls)."""
        if self._polls:
            return
        listener = self._listener()
        with listener.cursor() as cur:
            cur.execute(query("listen_jobs"))
            pooled = cur.execute(query("backend_pid")).fetchone() != (cur.connection.info.backend_pid,)
        listener._listening = True
        if self._polls is None:
            self._polls = pooled and not self._probe_arrives(listener)
            if self._polls:
                listener.close()
                log.warning("the database is reached through a transaction pool (PgBouncer?), where LISTEN "
                            "cannot work: this worker polls for new jobs instead (a look every "
                            "0.2 s at most); give --listen-dsn a direct connection for immediate wake-ups")

    def _probe_arrives(self, listener: Session) -> bool:
        """Whether a NOTIFY sent from another connection reaches ``listener`` in time."""
        token = f"probe-{uuid.uuid4().hex}"
        with translate_errors(), connect(self.config) as other:
            other.execute(query("notify_probe"), {"token": token})
        deadline = time.monotonic() + PROBE_WAIT_S
        conn = listener.connection()
        with translate_errors():
            while (left := deadline - time.monotonic()) > 0:
                select.select([conn.fileno()], [], [], left)
                for note in conn.notifies(timeout=0, stop_after=1000):
                    if note.payload == token:
                        return True
        return False

    def notify_fileno(self) -> int | None:
        """A descriptor that becomes readable when an enqueue notification may have arrived
        (subscribing first), then call ``wait_notify(0)``; None when this worker polls."""
        if not self.listening:
            self.listen()
        if self._polls:
            return None
        with translate_errors():
            return self._listener().connection().fileno()

    def wait_notify(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for an enqueue notification; True if one came. The ids of
        running jobs an operator cancelled that arrive with them wait for ``take_cancelled``."""
        if not self.listening:
            self.listen()
        if self._polls:
            time.sleep(timeout_s)
            return False
        conn = self._listener().connection()
        with translate_errors():
            if self._take_notifies(conn):
                return True
            ready, _, _ = select.select([conn.fileno()], [], [], timeout_s)
            return bool(ready) and self._take_notifies(conn)

    def _take_notifies(self, conn: psycopg.Connection[Any]) -> bool:
        enqueued = False
        for note in conn.notifies(timeout=0, stop_after=1000):
            if note.channel == channel("cancel"):
                self._cancelled.update(cancel_keys(note.payload))
            else:
                enqueued = True
        return enqueued

    def take_notified(self) -> bool:
        """Take the notifications that came while the connection ran a query (psycopg keeps
        them, and its descriptor does not turn readable for them); True when there were any."""
        listener = self._listener()
        # Never a new connection: it would not be listening, and the old descriptor would close.
        conn = listener._conn
        if self._polls or not listener._listening or conn is None or conn.closed or conn.broken:
            return False
        cancels = len(self._cancelled)
        with translate_errors():
            return self._take_notifies(conn) or len(self._cancelled) > cancels

    def take_cancelled(self) -> set[CancelKey]:
        """(job id, attempt) of the running jobs cancelled (``shardworker_cancel``) since the
        last call; the attempt None when an older release's cancel named the job alone."""
        taken, self._cancelled = self._cancelled, set()
        return taken

    def cancelled_among(self, keys: Sequence[tuple[int, int]]) -> set[tuple[int, int]]:
        """Which of the attempts ``keys`` (job id, attempt) an operator cancelled (a
        notification may have been missed)."""
        with self.cursor() as cur:
            cur.execute(query("job_cancelled_among"), {"ids": [i for i, _ in keys], "attempts": [a for _, a in keys]})
            return {(int(i), int(a)) for i, a in cur.fetchall()}


def cancel_keys(payload: str) -> set[CancelKey]:
    """The (job id, attempt) pairs of a ``shardworker_cancel`` payload: ``id:attempt`` entries,
    or ids alone (an older release's cancel: any attempt); anything else (a probe) is skipped."""
    keys: set[CancelKey] = set()
    for entry in payload.split(","):
        job_id, _, attempt = entry.partition(":")
        if job_id.isdigit() and (attempt.isdigit() or not attempt):
            keys.add((int(job_id), int(attempt) if attempt else None))
    return keys
