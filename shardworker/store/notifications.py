"""The worker's notifications, on its claim connection: enqueues (``shardworker_jobs``) wake
the dispatcher, and the cancels of running jobs (``shardworker_cancel``, sent by
``job_cancel``) are kept for ``take_cancelled``."""

from __future__ import annotations

import select
from collections.abc import Sequence
from typing import Any

import psycopg

from shardworker.store.connection import Session, translate_errors
from shardworker.store.sql import query


class Notifications(Session):
    """LISTEN on the worker's connection, and what arrives."""

    @property
    def listening(self) -> bool:
        """Whether this connection is subscribed to enqueue notifications."""
        return self._listening

    def listen(self) -> None:
        """Subscribe this connection to enqueue notifications."""
        with self.cursor() as cur:
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
        """Wait up to ``timeout_s`` for an enqueue notification; True if one came. The ids of
        running jobs an operator cancelled that arrive with them wait for ``take_cancelled``."""
        if not self._listening:
            self.listen()
        conn = self.connection()
        with translate_errors():
            if self._take_notifies(conn):
                return True
            ready, _, _ = select.select([conn.fileno()], [], [], timeout_s)
            return bool(ready) and self._take_notifies(conn)

    def _take_notifies(self, conn: psycopg.Connection[Any]) -> bool:
        enqueued = False
        for note in conn.notifies(timeout=0, stop_after=1000):
            if note.channel == "shardworker_cancel":
                self._cancelled_ids.update(int(i) for i in note.payload.split(",") if i.isdigit())
            else:
                enqueued = True
        return enqueued

    def take_cancelled(self) -> set[int]:
        """Ids of running jobs cancelled (``shardworker_cancel``) since the last call."""
        taken, self._cancelled_ids = self._cancelled_ids, set()
        return taken

    def cancelled_among(self, job_ids: Sequence[int]) -> set[int]:
        """Which of ``job_ids`` are cancelled (a notification may have been missed)."""
        with self.cursor() as cur:
            cur.execute(query("job_cancelled_among"), {"ids": list(job_ids)})
            return {int(i) for (i,) in cur.fetchall()}
