"""Sending events to jobs that wait for them (``job.wait_event``).

::

    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("UPDATE orders SET approved = true WHERE id = %s", (42,))
        shardworker.send_event(conn, "order:42:approved", {"by": "ana"})

The event is sent in the caller's transaction when one is open (rolled back, it never was),
else in one of its own. It wakes every job waiting on its key, whose wait returns the payload
(recorded for it: a retry gets the same one), and it is kept for ``run --event-retention``
(7 days by default) whether or not a job waits: a wait that starts later, in a job enqueued
before the event was sent, takes it. A handler sends with ``job.send_event`` instead (with
its outcome, through the outbox); an operator with ``shardworker events send KEY PAYLOAD``.
"""

from __future__ import annotations

from typing import Any

from shardworker.client import using_schema
from shardworker.core import events


def send_event(conn_or_dsn: Any, key: str, payload: Any = None, *, schema: str | None = None) -> int:
    """Send an event to ``key`` on an open psycopg connection (in its transaction, if one is
    open) or a DSN; how many waiting jobs it woke. ``EventError`` for a bad key or payload."""
    with using_schema(schema):
        key, payload_json = events.check_key(key), events.payload_json(payload)
        from shardworker.store import event_queries

        return event_queries.send_event(conn_or_dsn, key, payload_json)


async def send_event_async(aconn_or_dsn: Any, key: str, payload: Any = None, *, schema: str | None = None) -> int:
    """``send_event`` on a ``psycopg.AsyncConnection`` (in its transaction, if one is open) or a DSN."""
    with using_schema(schema):
        key, payload_json = events.check_key(key), events.payload_json(payload)
        from shardworker.store import event_queries

        return await event_queries.send_event_async(aconn_or_dsn, key, payload_json)
