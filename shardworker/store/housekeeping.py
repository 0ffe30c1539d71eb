"""What the worker's housekeeping asks of the database: counts per queue and status (for
metrics, without reading the whole table), retention's pruning, periodic schedules'
ticks; ``delete_queue`` for operators and ``recorded_steps`` for the steps demo."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from shardworker.store.connection import Session
from shardworker.store.enqueue import insert_job
from shardworker.store.sql import query


class StatusCount(NamedTuple):
    queue: str
    status: str
    jobs: int


class ScheduleState(NamedTuple):
    name: str
    schedule: str
    last_tick: datetime | None
    updated_at: datetime


class HousekeepingQueries(Session):
    """Counts, pruning and periodic ticks, on one session."""

    def stats(self) -> list[StatusCount]:
        """(queue, status, count) of every job."""
        with self.cursor() as cur:
            cur.execute(query("job_stats"))
            return [StatusCount(q, s, int(n)) for q, s, n in cur.fetchall()]

    def delete_queue(self, queue: str) -> int:
        """Delete every job of ``queue``, whatever its status; how many."""
        with self.cursor() as cur:
            cur.execute(query("queue_delete"), {"queue": queue})
            return cur.rowcount

    def recorded_steps(self, queue: str) -> list[tuple[int, str, int]]:
        """(job id, step name, attempt that recorded it) of every step recorded for the jobs
        of ``queue``."""
        with self.cursor() as cur:
            cur.execute(query("queue_recorded_steps"), {"queue": queue})
            return [(int(job_id), name, int(attempt)) for job_id, name, attempt in cur.fetchall()]

    def job_counts(self, exact_up_to: int = 1_000_000) -> tuple[list[StatusCount], bool]:
        """(queue, status, count) rows, and whether ``done`` is an estimate.

        Exact while the table holds up to ``exact_up_to`` rows (the planner's estimate).
        Above that, every status but ``done`` is still counted exactly through its partial
        index, and ``done`` per queue is the planner's share of rows in that queue (from
        ANALYZE's statistics) minus the exact counts: no statement reads the whole table.
        """
        with self.cursor() as cur:
            cur.execute(query("job_table_size"))
            row = cur.fetchone()
            size = int(row[0]) if row else 0
            if size <= exact_up_to:
                cur.execute(query("job_stats"))
                return [StatusCount(q, st, int(n)) for q, st, n in cur.fetchall()], False
            cur.execute(query("job_stats_unfinished"))
            rows = [StatusCount(q, st, int(n)) for q, st, n in cur.fetchall()]
            cur.execute(query("job_queue_shares"))
            shares = {q: float(f) for q, f in cur.fetchall()}
        others: dict[str, int] = {}
        for q, _, n in rows:
            others[q] = others.get(q, 0) + n
        for q, share in shares.items():
            rows.append(StatusCount(q, "done", max(0, round(size * share) - others.get(q, 0))))
        return sorted(rows), True

    def prune_batch(self, older_than_s: float, limit: int, statuses: Sequence[str]) -> int | None:
        """Delete up to ``limit`` jobs of ``statuses`` (done, failed, cancelled) finished more
        than ``older_than_s`` ago; how many, or None when another worker is pruning (the lock
        is per batch, in its transaction)."""
        with self.cursor(transaction=True) as cur:
            cur.execute(query("prune_lock"))
            row = cur.fetchone()
            if not (row and row[0]):
                return None
            cur.execute(query("prune_batch"), {"older_than_s": float(older_than_s), "limit": limit,
                                               "statuses": list(statuses)})
            return cur.rowcount

    def wake_due(self, batch: int) -> int:
        """Queue up to ``batch`` jobs whose sleep is over or whose wait for an event timed out
        (``shardworker.wake_due``, migration 0025); how many."""
        with self.cursor() as cur:
            cur.execute(query("wake_due"), {"batch": batch})
            row = cur.fetchone()
        return int(row[0]) if row else 0

    def wake_sent(self, within_s: float, batch: int) -> int:
        """Queue up to ``batch`` jobs whose wait for an event, begun within ``within_s``, has
        its event sent (``shardworker.wake_sent``: the net under a race); how many."""
        with self.cursor() as cur:
            cur.execute(query("wake_sent"), {"within_s": float(within_s), "batch": batch})
            row = cur.fetchone()
        return int(row[0]) if row else 0

    def prune_events(self, older_than_s: float, batch: int) -> int:
        """Delete the events sent more than ``older_than_s`` ago, ``batch`` a transaction until a
        batch comes back short, unless another worker is at it (the prune lock); how many."""
        total = 0
        while True:
            with self.cursor(transaction=True) as cur:
                cur.execute(query("prune_lock"))
                row = cur.fetchone()
                if not (row and row[0]):
                    return total
                cur.execute(query("events_prune"), {"older_than_s": float(older_than_s), "limit": batch})
                deleted = max(0, cur.rowcount)
            total += deleted
            if deleted < batch:
                return total

    def run_periodic(self, name: str, schedule: str,
                     plan: Callable[[datetime, datetime | None], tuple[list[dict[str, Any]], datetime]]) -> int:
        """Enqueue a schedule's due ticks, once across workers: lock its row (created on
        first sight), ask ``plan(db_now, last_tick)`` for the jobs to insert (``insert_job``
        keyword arguments) and the new last tick, insert them and record it, in one
        transaction. How many jobs were inserted (a live dedupe key skips one)."""
        with self.cursor(transaction=True) as cur:
            cur.execute(query("periodic_claim"), {"name": name, "schedule": schedule})
            row = cur.fetchone()
            assert row is not None
            last_tick, now = row
            jobs, new_last = plan(now, last_tick)
            inserted = sum(1 for fields in jobs if insert_job(cur, **fields) is not None)
            cur.execute(query("periodic_advance"), {"name": name, "last_tick": new_last})
            return inserted

    def periodic_state(self, within_s: float) -> list[ScheduleState]:
        """(name, schedule, last tick, updated at) of every schedule a worker checked within
        the last ``within_s`` seconds (each check moves ``updated_at``)."""
        with self.cursor() as cur:
            cur.execute(query("periodic_list"), {"within_s": float(within_s)})
            return [ScheduleState(*row) for row in cur.fetchall()]

    def forget_schedules(self, older_than_s: float) -> list[str]:
        """Delete the rows of the schedules no worker has checked for ``older_than_s``; their names."""
        with self.cursor() as cur:
            cur.execute(query("periodic_forget"), {"older_than_s": float(older_than_s)})
            return sorted(str(name) for (name,) in cur.fetchall())
