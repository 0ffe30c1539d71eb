"""The baseline of bench/throughput.py: a plain psycopg loop doing the worker's two commits per
batch (claim with ``FOR UPDATE SKIP LOCKED``, complete with one ``UPDATE ... FROM unnest(...)``)
and running the no-op handler in-process, without the outbox, its fsyncs or child processes."""

from __future__ import annotations

import time

import psycopg

# The baseline's two statements: the worker's claim, and a fenced batch completion.
CLAIM_SQL = """
WITH due AS (
    SELECT id FROM shardworker.jobs
    WHERE status = 'queued' AND run_at <= now() AND kind = %(kind)s
    ORDER BY priority, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE shardworker.jobs j
SET status = 'running', attempt = j.attempt + 1, locked_by = 'plain-loop', attempted_at = now(), updated_at = now()
FROM due WHERE j.id = due.id
RETURNING j.id, j.attempt, j.payload::text
"""
COMPLETE_SQL = """
UPDATE shardworker.jobs j
SET status = 'done', result = o.result, finished_at = now(), locked_by = NULL, updated_at = now()
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(results)s::jsonb[]) AS o(id, attempt, result)
WHERE j.id = o.id AND j.attempt = o.attempt AND j.status = 'running'
"""


def noop(_job: tuple[int, int, str]) -> None:
    """The baseline's handler, the same no-op as the worker's."""
    return None


def run(dsn: str, kind: str, batch: int) -> float:
    """Claim ``batch`` jobs, run the handler, complete them in one statement, until none are
    left; the seconds it took."""
    # No server-side prepared statements: once psycopg prepares a statement (its 5th run),
    # PostgreSQL may switch to a generic plan that rescans the unnest() once per running
    # row, and the loop would measure that plan instead of the work.
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
        t0 = time.perf_counter()
        while rows := conn.execute(CLAIM_SQL, {"kind": kind, "limit": batch}).fetchall():
            results = ["null" if (r := noop(row)) is None else str(r) for row in rows]
            conn.execute(COMPLETE_SQL, {"ids": [row[0] for row in rows], "attempts": [row[1] for row in rows],
                                        "results": results})
        return time.perf_counter() - t0
