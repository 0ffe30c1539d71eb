"""The worker's claim: due jobs, best first, within every limit, in one round trip.

A claim goes to PostgreSQL one of two ways. With no limit in its way (the worker caps none
of its kinds, and none of its kinds or queues is limited across workers or paused) it is
one statement, ``job_claim_plain``, in a transaction of its own. Otherwise it is a
transaction of five statements sent at once: lock the limited kinds' and queues' rows,
then ``job_claim``, which counts what runs and spends rate tokens. The plain statement
checks for limits itself, in its own snapshot, so a pause or a concurrency set by anyone
holds from the next claim: finding one, it claims nothing and says so, and the full claim
runs instead. Claims stay full for ``FLOW_RECHECK_S`` after that, then try plain again.

Under load the parent claims hundreds of times a second, a job or none each time; the
plain claim costs it and the server a fifth of what the full one does
(``bench/claim_cost.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from time import monotonic
from typing import Any

import psycopg

from shardworker.core.limits import MAX_JOB_INPUT_BYTES
from shardworker.core.model import Claim, ClaimedJob
from shardworker.errors import Reconnected
from shardworker.store.claim_floor import ClaimFloor
from shardworker.store.connection import Session, rollback
from shardworker.store.sql import native, native_params, query

FLOW_RECHECK_S = 1.0  # after a plain claim found a limit, how long claims go the full way


class ClaimQueries(Session):
    """``claim_within`` and what it needs: the claim floor and which statement to send."""

    def claim(self, kinds: Sequence[str], queues: Sequence[str] | None, worker_id: str,
              limit: int, claim_token: str | None = None, max_bytes: int = 1 << 62) -> list[ClaimedJob]:
        """``claim_within`` with no caps of this worker's own: the jobs only."""
        return self.claim_within(kinds, queues, worker_id, limit, claim_token, max_bytes).jobs

    def claim_within(self, kinds: Sequence[str], queues: Sequence[str] | None, worker_id: str, limit: int,
                     claim_token: str | None = None, max_bytes: int = 1 << 62, *,
                     caps: Mapping[str, int] | None = None, run_room: int | None = None,
                     attempts: Mapping[str, int] | None = None, generation: int | None = None,
                     server: str | None = None, max_input_bytes: int = MAX_JOB_INPUT_BYTES,
                     released: Sequence[str] = ()) -> Claim:
        """Claim up to ``limit`` due jobs and ``max_bytes`` of payload (at least one job when
        any is due): status running, attempt + 1, locked_by worker_id; at a job's first claim,
        ``attempts`` (kind: its handler's max_attempts) lowers its max_attempts. Within every limit:
        ``caps`` (kind: jobs this worker may still take of it), and for kinds and queues
        limited across workers, ``run_room`` (jobs it can start now; ``limit`` when None),
        their global concurrency and their rates; paused queues are skipped. The running jobs
        of the ``released`` workers (watched silent past their --release-slots-after) hold no
        slot of those limits.

        ``claim_token`` tags the claimed rows; if the reply is lost, ``release_claim`` with
        the same token gives back whatever the server did commit. With ``generation``, only on
        that connection: ``Reconnected`` (nothing sent) on a newer one, which the caller looks
        at first (``shardworker.worker.reapply_watch``); with ``server``, only on that server
        (``server_identity``): on another, nothing is claimed.

        A retried job comes with the steps its earlier attempts recorded, and a job that waited
        on others with their results, as JSON text, counted in ``max_bytes`` as that text; when
        the two are over ``max_input_bytes`` together, the job comes without them and with
        their sizes (``ClaimedJob.withheld``), for the child to fail it for good.
        """
        params = {"kinds": list(kinds), "queues": list(queues) if queues else None,
                  "worker_id": worker_id, "limit": limit, "claim_token": claim_token, "max_bytes": max_bytes,
                  "cap_kinds": list(caps or ()), "cap_rooms": [max(0, n) for n in (caps or {}).values()],
                  "run_room": limit if run_room is None else max(0, run_room),
                  "attempt_kinds": list(attempts or ()), "attempt_limits": list((attempts or {}).values()),
                  "server": server, "max_input_bytes": max_input_bytes, "released": list(released)}
        floor = self.claim_floor()
        while True:
            bounds = floor.params()
            rows = self._claim_rows({**params, **bounds}, generation)
            if any(row[15] is not None for row in rows):
                # Keys took turns: a later job of one key may have gone before an earlier job of
                # another, so the floor is the first candidate's key, not the first claimed.
                firsts = [(row[16], row[17], row[18]) for row in rows if row[18] is not None]
                floor.claimed(firsts[:1], bounds["floor_id"] is not None)
                break
            if not floor.claimed([(row[10], row[11], row[0]) for row in rows], bounds["floor_id"] is not None):
                break
        paces = [row[7] for row in rows if row[7] is not None]
        jobs = [ClaimedJob(row[0], row[1], row[2], row[3], row[4], row[5], row[8], row[9], row[6], row[12], claim_token,
                           None if row[13] is None else (row[13], row[14]), row[15], row[19])
                for row in rows]
        return Claim(jobs, min(paces) if paces else None)

    def claim_floor(self) -> ClaimFloor:
        """Where this store's next claim starts (``shardworker.store.claim_floor``)."""
        floor = self.__dict__.get("_claim_floor")
        if floor is None:
            floor = self.__dict__["_claim_floor"] = ClaimFloor()
        return floor

    def _claim_rows(self, params: dict[str, Any], generation: int | None) -> list[Any]:
        """The claimed rows: by the plain statement when nothing seems in its way, else (or
        when it finds a limit after all) by the full claim."""
        if not params["cap_kinds"] and monotonic() >= self.__dict__.get("_full_claims_until", 0.0):
            rows = self._claim_plain(params, generation)
            if not rows or rows[0][0] is not None:
                return rows
            self.__dict__["_full_claims_until"] = monotonic() + FLOW_RECHECK_S
        return self._claim_full(params, generation)

    def _on_generation(self, generation: int | None) -> None:
        if generation is not None and self.generation != generation:
            raise Reconnected()

    def _claim_plain(self, params: dict[str, Any], generation: int | None) -> list[Any]:
        """``job_claim_plain``: the claimed rows, or one row of NULLs when a limit is in the way."""
        with self.cursor() as cur, psycopg.RawCursor(cur.connection) as claiming:
            self._on_generation(generation)
            claiming.execute(native("job_claim_plain")[0], native_params("job_claim_plain", params),
                             prepare=self.prepares(cur.connection))
            return claiming.fetchall()

    def _claim_full(self, params: dict[str, Any], generation: int | None) -> list[Any]:
        """One claim transaction within every limit, sent at once; the claimed rows."""
        with self.cursor() as cur, psycopg.RawCursor(cur.connection) as claiming:
            self._on_generation(generation)
            conn = cur.connection
            prepare = self.prepares(conn)
            try:
                # BEGIN ... COMMIT spelled out in one pipeline: one Sync, one round trip, and a
                # reply lost after it means committed (psycopg's transaction() syncs before COMMIT).
                with conn.pipeline():
                    cur.execute("BEGIN")
                    cur.execute(query("flow_lock_kinds"), params, prepare=prepare)
                    cur.execute(query("flow_lock_queues"), params, prepare=prepare)
                    claiming.execute(native("job_claim")[0], native_params("job_claim", params), prepare=prepare)
                    cur.execute("COMMIT")
            except psycopg.Error:
                rollback(conn)
                raise
            return claiming.fetchall()
