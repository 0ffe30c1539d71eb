"""Helpers for the store tests: direct SQL reads, and short ways to enqueue, claim and
build outcomes through a ``PgStore``."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg
from psycopg import pq
from psycopg.rows import dict_row

from shardworker.core.model import ClaimedJob, Outcome
from shardworker.store.pg_store import PgStore


def connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True, connect_timeout=5)


def generic_plan(dsn: str, name: str) -> str:
    """EXPLAIN of the named query's generic plan, as a worker's prepared statement runs it
    (every parameter NULL)."""
    from shardworker.store.sql import query, to_native

    sql, names = to_native(query(name))
    with connect(dsn) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE plan_of AS {sql}")
        nulls = ", ".join(["NULL"] * len(names))
        return "\n".join(r[0] for r in conn.execute(f"EXPLAIN (COSTS OFF) EXECUTE plan_of({nulls})"))


def row(dsn: str, job_id: int) -> dict[str, Any]:
    """The job's row, with ``due_in_s`` = run_at - now() in seconds."""
    with connect(dsn) as conn, conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT *, extract(epoch FROM run_at - now())::float8 AS due_in_s "
                    "FROM shardworker.jobs WHERE id = %s", (job_id,))
        found = cur.fetchone()
    assert found is not None, f"job {job_id} not found"
    return found


def count_jobs(dsn: str) -> int:
    with connect(dsn) as conn:
        found = conn.execute("SELECT count(*) FROM shardworker.jobs").fetchone()
    assert found is not None
    return int(found[0])


def add(store: PgStore, kind: str = "k", payload: str = "null", *, queue: str = "default", priority: int = 0,
        max_attempts: int = 25, run_at: datetime | None = None, delay_s: float = 0.0,
        dedupe_key: str | None = None) -> int | None:
    return store.enqueue(kind, payload, queue=queue, priority=priority, max_attempts=max_attempts,
                         run_at=run_at, delay_s=delay_s, dedupe_key=dedupe_key)


def add_id(store: PgStore, kind: str = "k", **options: Any) -> int:
    job_id = add(store, kind, **options)
    assert job_id is not None
    return job_id


def claim_one(store: PgStore, worker: str = "w1", kinds: tuple[str, ...] = ("k",)) -> ClaimedJob:
    jobs = store.claim(list(kinds), None, worker, 1)
    assert len(jobs) == 1
    return jobs[0]


def done(job: ClaimedJob, result: str = '{"ok": true}') -> Outcome:
    return Outcome.done(job.id, job.attempt, result.encode())


def failure(job: ClaimedJob, delay_s: float, error: str = "boom") -> Outcome:
    return Outcome.retry(job.id, job.attempt, error, delay_s)


def frontend_messages(store: PgStore, action: Callable[[], Any]) -> list[str]:
    """The protocol messages the store's connection sends while ``action`` runs (libpq's trace)."""
    return [kind for kind, _ in frontend_sizes(store, action)]


def frontend_sizes(store: PgStore, action: Callable[[], Any]) -> list[tuple[str, int]]:
    """``frontend_messages`` with each message's length in bytes."""
    with store.cursor() as cur:
        pgconn = cur.connection.pgconn
    with tempfile.TemporaryFile() as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            action()
        finally:
            pgconn.untrace()
        trace.seek(0)
        lines = trace.read().decode(errors="replace").splitlines()
    return [(line.split("\t")[2], int(line.split("\t")[1])) for line in lines if line.startswith("F\t")]
