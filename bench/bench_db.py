"""The database of bench/throughput.py: a migrated DSN (the given one or an embedded server), a
table loaded with N queued jobs, the span read back from it, and server settings for a what-if."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

import psycopg
from psycopg import sql

from shardworker import JobSpec, enqueue_many
from shardworker.embedded import EmbeddedPostgres
from shardworker.store.migrate import apply_migrations


@contextlib.contextmanager
def database(dsn: str | None) -> Iterator[str]:
    """Yield a migrated DSN: the given one, or an embedded server stopped afterwards."""
    if dsn:
        apply_migrations(dsn)
        yield dsn
        return
    run_dir = tempfile.mkdtemp(prefix="sw-bench-pg-")
    server = EmbeddedPostgres(os.path.join(run_dir, "pgdata"))
    server.start()
    try:
        apply_migrations(server.dsn)
        yield server.dsn
    finally:
        server.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def load_jobs(dsn: str, n: int, kind: str) -> None:
    """Empty the jobs table (and job_steps, which references it), enqueue ``n`` no-op jobs, and
    settle the server.

    ANALYZE gives the claim query fresh statistics; the CHECKPOINT (superuser only, skipped
    otherwise) keeps the enqueue's dirty pages from being written during the measurement.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE shardworker.jobs CASCADE")  # and job_steps, job_dependencies
        enqueued = len(enqueue_many(conn, (JobSpec(kind) for _ in range(n))))
        if enqueued != n:
            raise RuntimeError(f"enqueued {enqueued} jobs, expected {n}")
        conn.execute("ANALYZE shardworker.jobs")
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            conn.execute("CHECKPOINT")


def table_span(dsn: str, n: int) -> tuple[float, float]:
    """Check that all ``n`` jobs are done; return (first claim, last finish) as epoch seconds."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        counts = dict(conn.execute("SELECT status, count(*) FROM shardworker.jobs GROUP BY status").fetchall())
        if counts != {"done": n}:
            raise RuntimeError(f"expected {n} done jobs, found {counts}")
        row = conn.execute("SELECT extract(epoch FROM min(attempted_at)), "
                           "extract(epoch FROM max(coalesce(finished_at, updated_at))) "
                           "FROM shardworker.jobs").fetchone()
    assert row is not None
    return float(row[0]), float(row[1])


@contextlib.contextmanager
def database_settings(dsn: str, settings: list[tuple[str, str]]) -> Iterator[None]:
    """``ALTER DATABASE <current> SET name = value`` for the runs' new sessions; RESET on exit."""
    if not settings:
        yield
        return
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT current_database()").fetchone()
        assert row is not None
        db = sql.Identifier(row[0])
        for name, value in settings:
            conn.execute(sql.SQL("ALTER DATABASE {} SET {} = {}").format(db, sql.SQL(name), sql.Literal(value)))
    try:
        yield
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name, _ in settings:
                conn.execute(sql.SQL("ALTER DATABASE {} RESET {}").format(db, sql.SQL(name)))
