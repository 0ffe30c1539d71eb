"""The worker's hot statements (the claims, the apply): prepared, and on which plan.

On a direct connection they run prepared, each on one generic plan: planning the claim
cost the server twice what running it did, hundreds of times a second under load. Never
through a transaction pool (PgBouncer), where a statement may meet a server connection it
was not prepared on; a connection is direct when its server's pid is the one its startup
gave (asked once per connection).

A generic plan is made from the statistics of the moment. PostgreSQL makes it again when
the table is vacuumed or analyzed, but a table just created or truncated waits for that up
to autovacuum's naptime (a minute), while a plan made on a handful of rows scans the whole
table for every batch (a hash join over a sequential scan) as it grows. So the plans are
made again every ``PLAN_REFRESH_S`` (``DISCARD PLANS``: the statements stay prepared).
"""

from __future__ import annotations

from time import monotonic
from typing import Any

import psycopg

from shardworker.store.sql import query

PREPARE_ONLY_WHEN_ASKED = 1 << 62  # a prepare_threshold no count reaches: prepare=True only
PLAN_REFRESH_S = 5.0


class Plans:
    """One session's answer to "prepare here?", per connection, and when its plans were made."""

    def __init__(self) -> None:
        self._generation = -1  # the connection asked about (Session.generation)
        self._direct = False
        self._made_at = 0.0

    def prepares(self, conn: psycopg.Connection[Any], generation: int) -> bool:
        """Whether the hot statements run prepared on ``conn`` (connection number ``generation``);
        on a direct connection, the plans are made again when due."""
        if self._generation != generation:
            direct = conn.execute(query("backend_pid")).fetchone() == (conn.info.backend_pid,)
            if direct:
                conn.prepare_threshold = PREPARE_ONLY_WHEN_ASKED
                conn.execute("SET plan_cache_mode = force_generic_plan")
            self._generation, self._direct, self._made_at = generation, direct, monotonic()
        elif self._direct and monotonic() - self._made_at >= PLAN_REFRESH_S:
            conn.execute("DISCARD PLANS")
            self._made_at = monotonic()
        return self._direct
