"""Events and waits on the caller's connection or a DSN: send an event (``shardworker.send_event``
and ``send_event_async``, inside the caller's transaction when one is open) and wake sleeping
jobs (``shardworker.jobs.wake``). The waits themselves begin and end in the database
(``shardworker.send_event``, ``begin_wait``, ``wake_due``: migration 0025)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from shardworker.store.enqueue_async import async_cursor_for
from shardworker.store.job_queries import cursor_for
from shardworker.store.sql import query


def send_event(conn_or_dsn: Any, key: str, payload_json: bytes) -> int:
    """Send the event (in the caller's transaction when one is open); the jobs it woke."""
    with cursor_for(conn_or_dsn, transaction=True) as cur:
        cur.execute(query("event_send"), {"key": key, "payload": payload_json})
        row = cur.fetchone()
    return int(row[0]) if row else 0


async def send_event_async(conn_or_dsn: Any, key: str, payload_json: bytes) -> int:
    """``send_event`` on a ``psycopg.AsyncConnection`` or a DSN."""
    async with async_cursor_for(conn_or_dsn, transaction=True) as cur:
        await cur.execute(query("event_send"), {"key": key, "payload": payload_json})
        row = await cur.fetchone()
    return int(row[0]) if row else 0


def wake_jobs(conn_or_dsn: Any, job_ids: Sequence[int],
              check: Callable[[dict[int, tuple[str, str | None]]], None]) -> int:
    """Lock ``job_ids``, hand ``check`` their (status, what they wait on) to refuse with, then
    queue the sleeping ones now, in one transaction; how many."""
    with cursor_for(conn_or_dsn, transaction=True) as cur:
        cur.execute(query("job_lock_for_wake"), {"ids": list(job_ids)})
        check({int(i): (str(s), w) for i, s, w in cur.fetchall()})
        cur.execute(query("job_wake"), {"ids": list(job_ids)})
        return max(0, cur.rowcount)
