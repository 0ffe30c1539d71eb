"""How far the database holds what a flusher applied, and the holds on every worker's claims
while one re-applies what the database lost (``shardworker.flusher.marks`` decides when).

``outbox_marks`` has one row per outbox: its batch count and per-shard positions, written in
the transaction of each batch (``job_apply_outcomes``, ``job_steps_insert``, or by itself
here). ``claim_holds`` has a row per holder; no claim takes a job while one is live.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import orjson

from shardworker.core.model import ClaimedJob, Mark, Outcome
from shardworker.store.connection import Session
from shardworker.store.sql import query
from shardworker.store.worker_queries import mark_params


class DatabaseMark(NamedTuple):
    """An outbox's mark as the database holds it."""

    batch: int
    positions: dict[int, tuple[int, int, int]]


class Hold(NamedTuple):
    holder: str
    reason: str
    left_s: float


class MarkQueries(Session):
    """Marks and claim holds, on the store's own session."""

    def mark_outbox(self, mark: Mark) -> None:
        """Check and write ``mark`` in a transaction of its own (``DatabaseWentBack`` when the
        database holds less than ``mark.expect``)."""
        with self.cursor() as cur:
            cur.execute(query("outbox_mark_write"), mark_params(mark))

    def check_mark(self, outbox_id: str, expect: int) -> int:
        """The batch the database holds of ``outbox_id``; ``DatabaseWentBack`` when it is less
        than ``expect`` (the batch its flusher saw committed)."""
        params = {**mark_params(None), "mark_outbox": outbox_id, "mark_worker": "", "mark_expect": expect}
        with self.cursor() as cur:
            cur.execute(query("outbox_mark_write"), params)
            row = cur.fetchone()
        return int(row[0]) if row else 0

    def read_mark(self, outbox_id: str) -> DatabaseMark | None:
        """The database's mark of ``outbox_id``; None when it holds none."""
        with self.cursor() as cur:
            cur.execute(query("outbox_mark_read"), {"outbox_id": outbox_id})
            row = cur.fetchone()
        if row is None:
            return None
        positions = {int(shard): (int(p[0]), int(p[1]), int(p[2])) for shard, p in orjson.loads(row[1]).items()}
        return DatabaseMark(int(row[0]), positions)

    def all_marks(self) -> dict[str, int]:
        """Every outbox's batch count as the database holds it."""
        with self.cursor() as cur:
            cur.execute(query("outbox_marks_all"))
            return {str(o): int(b) for o, b in cur.fetchall()}

    def hold_claims(self, holder: str, reason: str, seconds: float) -> None:
        """Hold every worker's claims for ``seconds`` (again: moves this holder's hold on)."""
        with self.cursor() as cur:
            cur.execute(query("claim_hold"), {"holder": holder, "reason": reason, "seconds": seconds})

    def release_claims(self, holder: str) -> None:
        with self.cursor() as cur:
            cur.execute(query("claim_unhold"), {"holder": holder})

    def settle_hold(self, holder: str, reason: str, seconds: float, server: str, window_s: float) -> None:
        """Hold every worker's claims until each worker that may have lost work to ``server``
        has checked its mark there (``settle_end``), or for ``seconds``."""
        with self.cursor() as cur:
            cur.execute(query("claim_settle"), {"holder": holder, "reason": reason, "seconds": seconds,
                                                "server": server, "window_s": window_s})

    def settle_end(self, holder: str) -> list[str]:
        """End ``holder``'s hold for a new server once every worker it waits for has checked
        there; the workers still awaited (none: it ended)."""
        with self.cursor() as cur:
            cur.execute(query("claim_settle_end"), {"holder": holder})
            return [str(r[0]) for r in cur.fetchall()]

    def worker_checked(self, worker_id: str, server: str) -> bool:
        """Say this worker has checked, on ``server``, that the database holds what it applied;
        False when its row is missing (its heartbeat writes it again)."""
        with self.cursor() as cur:
            cur.execute(query("worker_checked"), {"worker_id": worker_id, "server": server})
            return cur.fetchone() is not None

    def claim_holds(self) -> list[Hold]:
        """The holds live now, longest first."""
        with self.cursor() as cur:
            cur.execute(query("claim_holds_live"))
            return [Hold(str(h), str(r), float(s)) for h, r, s in cur.fetchall()]

    def server_identity(self) -> str:
        """Which server process and database this session reaches (text: only compared)."""
        with self.cursor() as cur:
            cur.execute(query("server_identity"))
            row = cur.fetchone()
        return str(row[0]) if row else ""

    def preview_outcomes(self, outcomes: Sequence[Outcome]) -> set[int]:
        """The jobs of ``outcomes`` that ``apply_outcomes`` would apply to now (read only)."""
        if not outcomes:
            return set()
        with self.cursor() as cur:
            cur.execute(query("job_apply_preview"), {"ids": [o.job_id for o in outcomes],
                                                     "attempts": [o.attempt for o in outcomes],
                                                     "uids": [o.uid for o in outcomes],
                                                     "tokens": [o.token for o in outcomes]})
            return {int(r[0]) for r in cur.fetchall()}

    def reclaim(self, worker_id: str, jobs: Sequence[ClaimedJob]) -> list[int]:
        """Claim again, as they were claimed, the held ``jobs`` whose claims the database lost
        by going back in time; their ids."""
        if not jobs:
            return []
        with self.cursor() as cur:
            cur.execute(query("job_reclaim"), {"worker_id": worker_id, "ids": [j.id for j in jobs],
                                               "attempts": [j.attempt for j in jobs], "uids": [j.uid for j in jobs],
                                               "tokens": [j.token for j in jobs]})
            return [int(r[0]) for r in cur.fetchall()]
