"""Queues for operators: the backlog by queue and kind, and each queue's state (paused,
limits across workers) kept in ``shardworker.queues``.

``QueueQueries`` runs them on the store's own session (for the worker and ``stats``);
``list_queues``, ``set_paused`` and ``set_limits`` on the caller's connection or a DSN (for
``shardworker.queues``, which checks names and rates first; the table's checks back it).
The backlog reads queued and running rows only, through their partial indexes, so it stays
cheap however many finished rows the table holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
import psycopg

from shardworker.core.flow import Rate
from shardworker.core.limits import SILENT_AFTER_S
from shardworker.core.views import BacklogRow, KeyBacklog, LimitUse, QueueInfo, QueueState
from shardworker.store.connection import Session
from shardworker.store.job_queries import cursor_for
from shardworker.store.sql import query

# A worker's flow report counts while its heartbeat is this recent: the age at which
# `shardworker workers` stops calling a worker live (--silent-after's default).
LIVE_WITHIN_S = SILENT_AFTER_S


class QueueQueries(Session):
    """The backlog and the queues' state, on one session."""

    def backlog(self, live_within_s: float = LIVE_WITHIN_S) -> list[BacklogRow]:
        """One row per queue and kind with jobs queued or claimed, and one (kind None) per queue
        with a state row and none; prefetched from the reports of workers that beat within
        ``live_within_s``. Sorted by queue, then kind."""
        with self.cursor() as cur:
            return read_backlog(cur, live_within_s)

    def backlog_report(self, interval_s: float) -> tuple[float, list[BacklogRow]]:
        """The backlog as the metrics show it: (its age in seconds, its rows). Computed here
        when the last report is older than ``interval_s`` and no other worker is computing
        one (the report row's lock decides), else read from the last one: across every
        worker, at most one backlog query per ``interval_s``."""
        with self.cursor(transaction=True) as cur:
            cur.execute(query("backlog_report_claim"), {"interval_s": interval_s})
            if cur.fetchone() is not None:
                rows = read_backlog(cur, LIVE_WITHIN_S)
                cur.execute(query("backlog_report_store"), {"rows": orjson.dumps([list(row) for row in rows]).decode()})
                return 0.0, rows
            cur.execute(query("backlog_report_read"))
            found = cur.fetchone()
        if found is None:
            return float("inf"), []
        return float(found[0]), [BacklogRow(*row) for row in found[1]]

    def limits(self) -> list[LimitUse]:
        """Every limit across workers and what uses it now (``limits_in_use``)."""
        with self.cursor() as cur:
            return read_limits(cur)

    def queue_states(self) -> list[QueueState]:
        """Every queue with a state row, by name."""
        with self.cursor() as cur:
            return read_states(cur)

    def pause_queue(self, name: str) -> QueueState:
        """Pause ``name``: no worker claims its jobs (running ones finish); its limits stay."""
        with self.cursor() as cur:
            return write_paused(cur, name, True)

    def resume_queue(self, name: str) -> QueueState:
        """Let workers claim ``name``'s jobs again; its limits stay."""
        with self.cursor() as cur:
            return write_paused(cur, name, False)

    def limit_queue(self, name: str, *, concurrency: int | None = None, rate: Rate | None = None,
                    clear: bool = False, key_concurrency: int | None = None) -> QueueState:
        """Set the limits given (the others stay), or ``clear`` them all."""
        with self.cursor() as cur:
            return write_limits(cur, name, concurrency, rate, clear, key_concurrency)


def list_queues(conn_or_dsn: Any) -> list[QueueInfo]:
    """Every queue with jobs queued or claimed, or a state row: its state and backlog, by name."""
    with cursor_for(conn_or_dsn, transaction=False) as cur:
        return summarize(read_states(cur), read_backlog(cur, LIVE_WITHIN_S))


def set_paused(conn_or_dsn: Any, name: str, paused: bool) -> QueueState:
    """Pause or resume ``name``; its state after."""
    with cursor_for(conn_or_dsn, transaction=False) as cur:
        return write_paused(cur, name, paused)


def set_limits(conn_or_dsn: Any, name: str, concurrency: int | None, rate: Rate | None, clear: bool,
               key_concurrency: int | None = None, weights: dict[str, int] | None = None) -> QueueState:
    """Set or clear ``name``'s limits (and its keys' weights, merged into those set); its state after."""
    with cursor_for(conn_or_dsn, transaction=False) as cur:
        return write_limits(cur, name, concurrency, rate, clear, key_concurrency, weights)


def limits_in_use(conn_or_dsn: Any) -> list[LimitUse]:
    """Every limit across workers and what uses it now, on the caller's connection or a DSN."""
    with cursor_for(conn_or_dsn, transaction=False) as cur:
        return read_limits(cur)


def read_limits(cur: psycopg.Cursor[Any]) -> list[LimitUse]:
    cur.execute(query("limits_in_use"))
    return [LimitUse(str(scope), str(name), str(limit), float(value), None if use is None else float(use),
                     None if at is None else int(at))
            for scope, name, limit, value, use, at in cur.fetchall()]


def key_backlog(conn_or_dsn: Any, limit: int) -> list[KeyBacklog]:
    """The ``limit`` keys with the most unfinished jobs, most first (``key_backlog``)."""
    with cursor_for(conn_or_dsn, transaction=False) as cur:
        cur.execute(query("key_backlog"), {"limit": limit})
        return [KeyBacklog(str(k), int(a), int(s), int(c), None if age is None else float(age))
                for k, a, s, c, age in cur.fetchall()]


def read_backlog(cur: psycopg.Cursor[Any], live_within_s: float) -> list[BacklogRow]:
    cur.execute(query("queue_backlog"), {"live_within_s": float(live_within_s)})
    return [BacklogRow(str(q), None if k is None else str(k), int(a), int(s), int(p), int(r),
                       None if age is None else float(age))
            for q, k, a, s, p, r, age in cur.fetchall()]


def read_states(cur: psycopg.Cursor[Any]) -> list[QueueState]:
    cur.execute(query("queue_states"))
    return [_state(row) for row in cur.fetchall()]


def write_paused(cur: psycopg.Cursor[Any], name: str, paused: bool) -> QueueState:
    cur.execute(query("queue_set_paused"), {"name": name, "paused": paused})
    return _state(cur.fetchone())


def write_limits(cur: psycopg.Cursor[Any], name: str, concurrency: int | None, rate: Rate | None,
                 clear: bool, key_concurrency: int | None = None, weights: dict[str, int] | None = None) -> QueueState:
    cur.execute(query("queue_set_limits"), {"name": name, "concurrency": concurrency, "clear": clear,
                                            "key_concurrency": key_concurrency,
                                            "key_weights": None if weights is None else orjson.dumps(weights).decode(),
                                            "rate_limit": None if rate is None else rate.n,
                                            "rate_period_s": None if rate is None else rate.period_s})
    return _state(cur.fetchone())


def _state(row: tuple[Any, ...] | None) -> QueueState:
    assert row is not None  # an upsert returns its row
    name, paused, concurrency, rate_limit, period_s, key_concurrency, weights = row
    rate = None if rate_limit is None else Rate(int(rate_limit), float(period_s))
    return QueueState(str(name), bool(paused), None if concurrency is None else int(concurrency), rate,
                      None if key_concurrency is None else int(key_concurrency),
                      None if weights is None else {str(k): int(w) for k, w in weights.items()})


def summarize(states: Iterable[QueueState], backlog: Iterable[BacklogRow]) -> list[QueueInfo]:
    """Each queue's state with its backlog summed over kinds (the oldest age is the largest)."""
    by_name = {s.name: s for s in states}
    totals: dict[str, list[int]] = {}
    oldest: dict[str, float | None] = {}
    for row in backlog:
        sums = totals.setdefault(row.queue, [0, 0, 0, 0])
        for i, n in enumerate((row.available, row.scheduled, row.prefetched, row.running)):
            sums[i] += n
        ages = [a for a in (oldest.get(row.queue), row.oldest_available_s) if a is not None]
        oldest[row.queue] = max(ages) if ages else None
    infos = []
    for name in sorted(by_name.keys() | totals.keys()):
        state = by_name.get(name, QueueState(name, False, None, None))
        available, scheduled, prefetched, running = totals.get(name, [0, 0, 0, 0])
        infos.append(QueueInfo(name, state.paused, state.concurrency, state.rate, available, scheduled, prefetched,
                               running, oldest.get(name), state.key_concurrency, state.key_weights))
    return infos
