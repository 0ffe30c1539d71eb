"""The workers table: heartbeats, who is registered under an id, the rescuer's lock and
the rescue of silent workers' jobs."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple

import orjson

from shardworker.core.limits import ERRORS_KEPT
from shardworker.core.views import Beat, FlowCount, Rescued, Serving, Watched, WorkerInfo
from shardworker.store.connection import Session
from shardworker.store.sql import query


class HeartbeatRow(NamedTuple):
    hostname: str
    pid: int
    heartbeat_at: datetime


class WorkerRows(Session):
    """Heartbeat rows and rescue, on one session."""

    def heartbeat(self, worker_id: str, hostname: str, pid: int, running: int | None = None,
                  pending: int | None = None, flow: Sequence[FlowCount] | None = None, *,
                  take_over: bool = True, serves: Serving | None = None) -> tuple[str, int] | None:
        """Beat for ``worker_id`` as (hostname, pid), with its load and its ``flow`` report (None:
        not known) and what it ``serves`` (None: nothing, as a drain); None when written, else
        the (hostname, pid) of the other process whose row it left alone (only without ``take_over``)."""
        return self.beat(worker_id, hostname, pid, running, pending, flow, take_over=take_over, serves=serves).holder

    def beat(self, worker_id: str, hostname: str, pid: int, running: int | None = None,
             pending: int | None = None, flow: Sequence[FlowCount] | None = None, *,
             take_over: bool = True, serves: Serving | None = None, started_at: datetime | None = None) -> Beat:
        """``heartbeat``, also telling whether the beat wrote the row afresh (``Beat.inserted``):
        without ``take_over``, the row was gone, removed by a peer's rescue of this worker
        (``Beat.rescued``: a rescue left a tombstone of the row this process had, ``started_at``)
        or lost by the database going back in time; and the row's ``started_at`` and the server
        reached (``Beat.server``)."""
        report = None if flow is None else orjson.dumps([list(f) for f in flow]).decode()
        kinds, queues, rescue_after_s, slots_after_s = serves or (None, None, None, None)
        with self.cursor() as cur:
            cur.execute(query("worker_heartbeat"), {"worker_id": worker_id, "hostname": hostname, "pid": pid,
                                                    "running": running, "pending": pending, "flow": report,
                                                    "take_over": take_over, "kinds": kinds and list(kinds),
                                                    "queues": queues and list(queues),
                                                    "rescue_after_s": rescue_after_s, "slots_after_s": slots_after_s,
                                                    "started_at": started_at})
            row = cur.fetchone()
        if row is None:
            return Beat(None, False)
        if row[0]:
            return Beat(None, bool(row[3]), bool(row[4]), row[5], str(row[6]))
        # Committed after our snapshot.
        return Beat((str(row[1] or "an unknown host"), int(row[2] or 0)), False, server=str(row[6]))

    def worker_row(self, worker_id: str) -> HeartbeatRow | None:
        """(hostname, pid, heartbeat_at) of ``worker_id``'s heartbeat row; None without one."""
        with self.cursor() as cur:
            cur.execute(query("worker_get"), {"worker_id": worker_id})
            row = cur.fetchone()
        return None if row is None else HeartbeatRow(str(row[0]), int(row[1]), row[2])

    def workers(self) -> list[WorkerInfo]:
        """Every worker's row: id, host, pid, started, last heartbeat, load, seconds silent."""
        with self.cursor() as cur:
            cur.execute(query("worker_list"))
            return [WorkerInfo(str(w), str(h), int(p), started, beat, running, pending, float(silent), slots_after,
                               {str(k): int(n) for k, n in slots.items()})
                    for w, h, p, started, beat, running, pending, silent, slots_after, slots in cur.fetchall()]

    def forget_worker(self, worker_id: str, hostname: str, pid: int) -> None:
        """Remove the heartbeat row this (hostname, pid) wrote, unless jobs still run under the id."""
        with self.cursor() as cur:
            cur.execute(query("worker_forget"), {"worker_id": worker_id, "hostname": hostname, "pid": pid})

    def release_worker(self, worker_id: str, hostname: str, pid: int) -> None:
        """The end of a drain that beat under ``worker_id``: remove its row as ``forget_worker``
        does, or leave it naming no process (pid 0) while jobs still run under the id."""
        with self.cursor() as cur:
            cur.execute(query("worker_release"), {"worker_id": worker_id, "hostname": hostname, "pid": pid})

    def heartbeats(self) -> dict[str, datetime]:
        """Each worker id's last heartbeat."""
        return {w: watched.heartbeat_at for w, watched in self.rescue_watch().items()}

    def rescue_watch(self) -> dict[str, Watched]:
        """Each worker id's last heartbeat, its own rescue window and the silence after which
        its slots are released (None: not given)."""
        with self.cursor() as cur:
            cur.execute(query("worker_heartbeats"))
            return {w: Watched(t, window, slots) for w, t, window, slots in cur.fetchall()}

    def rescue_workers(self, observed: Sequence[tuple[str, datetime]], grace_s: float = 0.0) -> Rescued:
        """Requeue the running jobs of workers whose heartbeat is still the one observed (and
        drop their rows); rescued jobs wait ``grace_s`` before they may be claimed again. A
        worker another rescuer removed first is in neither list."""
        with self.cursor() as cur:
            cur.execute(query("rescue_workers"), {"worker_ids": [w for w, _ in observed],
                                                  "heartbeats": [b for _, b in observed], "grace_s": grace_s,
                                                  "errors_kept": ERRORS_KEPT})
            row = cur.fetchone()
        return Rescued(tuple(row[0]), list(row[1])) if row else Rescued((), [])
