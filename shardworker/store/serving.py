"""What live workers serve: the kinds (in their queues) that the heartbeat rows of workers
within their rescue window name (``shardworker.serving_workers``, migration 0013).

``ServingQueries.unserved_kinds`` lists queued jobs of kinds no live worker serves (for
``doctor``, the dashboard and the worker's own log); ``refuse_unserved`` and
``refuse_unserved_async`` refuse, before an ``enqueue(..., strict=True)``, the kinds no live
worker serves, on the caller's connection (inside its transaction) or one of their own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from shardworker.core.views import UnservedKind
from shardworker.errors import KindNotServed
from shardworker.store.connection import Session
from shardworker.store.enqueue_async import async_cursor_for
from shardworker.store.job_queries import cursor_for
from shardworker.store.sql import query

UNSERVED_SHOWN = 20  # kinds listed, most queued jobs first


class ServingQueries(Session):
    """Queued kinds no live worker serves, on the store's own session."""

    def unserved_kinds(self, also_kinds: Sequence[str] = (), also_queues: Sequence[str] | None = None,
                       limit: int = UNSERVED_SHOWN) -> list[UnservedKind]:
        """Queued jobs, by queue and kind, of kinds no live worker serves in their queue, most
        first; ``also_kinds`` in ``also_queues`` (None: every queue) count as served."""
        with self.cursor() as cur:
            cur.execute(query("kinds_unserved"), {"also_kinds": list(also_kinds),
                                                  "also_queues": list(also_queues) if also_queues else None,
                                                  "limit": limit})
            return [UnservedKind(str(q), str(k), int(n), oldest, float(waiting))
                    for q, k, n, oldest, waiting in cur.fetchall()]


def refuse_unserved(conn_or_dsn: Any, pairs: Iterable[tuple[str, str]]) -> None:
    """Raise ``KindNotServed`` naming each (queue, kind) of ``pairs`` no live worker serves."""
    params = _params(pairs)
    with cursor_for(conn_or_dsn, transaction=False) as cur:
        cur.execute(query("kinds_unserved_of"), params)
        _refuse(cur.fetchall())


async def refuse_unserved_async(aconn_or_dsn: Any, pairs: Iterable[tuple[str, str]]) -> None:
    """``refuse_unserved`` on a ``psycopg.AsyncConnection`` or a DSN."""
    params = _params(pairs)
    async with async_cursor_for(aconn_or_dsn, transaction=False) as cur:
        await cur.execute(query("kinds_unserved_of"), params)
        _refuse(await cur.fetchall())


def _params(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    distinct = sorted(set(pairs))
    return {"queues": [q for q, _ in distinct], "kinds": [k for _, k in distinct]}


def _refuse(unserved: Sequence[tuple[str, str]]) -> None:
    if not unserved:
        return
    named = ", ".join(f"{kind!r} in queue {queue!r}" for queue, kind in unserved[:5])
    more = f" and {len(unserved) - 5} more" if len(unserved) > 5 else ""
    raise KindNotServed(f"no live worker handles {named}{more} (strict): nothing enqueued; start a worker "
                        "with a handler for it, or check the kind's spelling and the queue")
