"""Inserting jobs that wait on others: ``enqueue(..., after=)`` and a handler's follow-ups.

One plan serves both, as a generator of ``(query name, parameters)`` that receives each
statement's rows (``run_plan`` drives it on a cursor, ``run_plan_async`` on an async one),
inside the caller's transaction:

1. an enqueue refuses ids in ``after`` that do not exist (``job_dependencies_missing``);
2. the jobs are inserted in order, ids drawn by the statement (or the ids given, for
   follow-ups inserted again after the database went back in time, once the sequence is past
   them: ``job_ids_reserve``), those with dependencies as ``waiting`` (``job_dependent_insert``);
   a job whose dedupe key is live is not inserted;
3. the edges are recorded and the dependencies locked until commit (``job_dependencies_link``),
   so an outcome applied to one of them meanwhile waits and then sees the new edge;
4. each new waiting job is settled from its dependencies as they are now: queued when all
   are done, cancelled when one failed, was cancelled or does not exist
   (``job_dependencies_settle_new``); then workers are woken.

The flusher's part (settling the jobs waiting on an outcome it applies) is in the apply
statement itself (``job_apply_outcomes``).
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from shardworker.core.config import StoreConfig
from shardworker.core.followups import DependentRow
from shardworker.errors import EnqueueError
from shardworker.store.connection import first_line
from shardworker.store.enqueue import REFUSED, EnqueueQueries, borrowed_cursor
from shardworker.store.enqueue_async import async_cursor_for
from shardworker.store.sql import query

log = logging.getLogger(__name__)

Plan = Generator[tuple[str, dict[str, Any]], list[tuple[Any, ...]], list[int | None]]


def plan_insert(rows: Sequence[DependentRow], *, refuse_missing: bool) -> Plan:
    """Insert ``rows`` with their dependencies; their ids in order (None: not inserted, its
    dedupe key is live). ``refuse_missing``: raise ``EnqueueError`` (before inserting
    anything) when ``after`` names a job that does not exist; else such a job is cancelled."""
    existing = sorted({ref for row in rows for ref in row.after if ref > 0})
    if refuse_missing and existing:
        missing = yield "job_dependencies_missing", {"ids": existing}
        if missing:
            raise EnqueueError(f"after: job {missing[0][0]} does not exist; nothing was enqueued")
    given = [r.id for r in rows]
    if any(i is not None for i in given):
        reserved = yield "job_ids_reserve", {"max_id": max(i for i in given if i is not None)}
        if not (reserved and reserved[0][0]):
            log.warning("follow-up jobs inserted again after the database went back get new ids: this role may not "
                        "draw from the jobs' id sequence (GRANT USAGE on it); their outcomes kept elsewhere will "
                        "not find them, and they run again")
            given = [None] * len(rows)
    inserted = yield "job_dependent_insert", {
        "kinds": [r.kind for r in rows], "queues": [r.queue for r in rows], "payloads": [r.payload_json for r in rows],
        "priorities": [r.priority for r in rows], "max_attempts": [r.max_attempts for r in rows],
        "run_ats": [r.run_at for r in rows], "delays": [r.delay_s for r in rows],
        "dedupe_keys": [r.dedupe_key for r in rows], "deps_total": [len(r.after) for r in rows],
        "given_ids": given, "given_uids": [r.uid for r in rows], "reinserted": [r.reinserted for r in rows],
        "keys": [r.key for r in rows], "tags": [Jsonb(list(r.tags)) if r.tags else None for r in rows],
        "traces": [r.trace for r in rows]}
    ids: list[int | None] = [None if i is None else int(i) for _, i, _ in inserted]
    new = [bool(fresh) for _, _, fresh in inserted]
    edges = [(ids[n], ref if ref > 0 else ids[-ref - 1]) for n, row in enumerate(rows) if new[n]
             for ref in row.after if ref > 0 or ids[-ref - 1] is not None]
    if edges:
        yield "job_dependencies_link", {"job_ids": [e[0] for e in edges], "depends_on": [e[1] for e in edges]}
    waiting = [ids[n] for n, row in enumerate(rows) if new[n] and row.after]
    if waiting:
        yield "job_dependencies_settle_new", {"ids": waiting}
    if any(new):
        yield "notify_jobs", {}
    return [i if fresh else None for i, fresh in zip(ids, new, strict=True)]


def run_plan(cur: psycopg.Cursor[Any], plan: Plan) -> list[int | None]:
    """Drive ``plan`` on ``cur``; a statement PostgreSQL refuses raises ``EnqueueError``."""
    try:
        name, params = next(plan)
        while True:
            try:
                cur.execute(query(name), params)
            except REFUSED as exc:
                raise EnqueueError(f"job rejected: {first_line(exc)}") from exc
            name, params = plan.send(cur.fetchall() if cur.description else [])
    except StopIteration as done:
        return list(done.value)


async def run_plan_async(cur: psycopg.AsyncCursor[Any], plan: Plan) -> list[int | None]:
    """``run_plan`` on an async cursor."""
    try:
        name, params = next(plan)
        while True:
            try:
                await cur.execute(query(name), params)
            except REFUSED as exc:
                raise EnqueueError(f"job rejected: {first_line(exc)}") from exc
            name, params = plan.send(await cur.fetchall() if cur.description else [])
    except StopIteration as done:
        return list(done.value)


def enqueue_dependents(conn_or_dsn: Any, rows: Sequence[DependentRow]) -> list[int | None]:
    """Enqueue ``rows`` (some with ``after``) in one transaction on the caller's connection
    (inside its open transaction, joining it) or one of its own to a DSN."""
    if not isinstance(conn_or_dsn, str):
        with borrowed_cursor(conn_or_dsn, transaction=True) as cur:
            return run_plan(cur, plan_insert(rows, refuse_missing=True))
    session = EnqueueQueries(StoreConfig(dsn=conn_or_dsn))
    try:
        with session.cursor(transaction=True) as cur:
            return run_plan(cur, plan_insert(rows, refuse_missing=True))
    finally:
        session.close()


async def enqueue_dependents_async(conn_or_dsn: Any, rows: Sequence[DependentRow]) -> list[int | None]:
    """``enqueue_dependents`` on a ``psycopg.AsyncConnection`` or a DSN."""
    async with async_cursor_for(conn_or_dsn, transaction=True) as cur:
        return await run_plan_async(cur, plan_insert(rows, refuse_missing=True))
