"""Names and keys too big for the database's indexes (issue 20, point 2), on a real PostgreSQL
with real workers: refused at enqueue in one line on every path; rows that exist already
(written by raw SQL) still reach every status; a refusal is never reported as an outage."""

from __future__ import annotations

import asyncio
import random
import secrets
import signal
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner, Result

from shardworker import App, JobSpec, enqueue, enqueue_async, enqueue_many, enqueue_many_async
from shardworker.cli.main import main
from shardworker.core.config import WorkerConfig
from shardworker.core.retry import is_retryable
from shardworker.errors import ConfigError, DatabaseUnavailable, DataRejected, EnqueueError
from shardworker.store.pg_store import PgStore, StoreConfig
from tests.helpers import exit_code, kill_worker_group, query, runs, start_worker, wait_for, worker_log

# With any kind, over the ~2.7 KB a btree entry may hold; random, so compression cannot shrink it.
BIG_QUEUE = secrets.token_hex(1500)


def insert_raw(dsn: str, kind: str, queue: str = BIG_QUEUE, max_attempts: int = 25, payload: str = "null") -> int:
    """A job written by raw SQL, as before the limits existed."""
    return int(query(dsn, "INSERT INTO shardworker.jobs (kind, queue, max_attempts, payload) "
                          "VALUES (%s, %s, %s, %s::jsonb) RETURNING id", kind, queue, max_attempts, payload)[0][0])


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), env={"SHARDWORKER_DSN": None, "SHARDWORKER_OUTBOX_DIR": None})


def one_line_error(result: Result, *fragments: str) -> None:
    assert result.exit_code == 1, (result.exit_code, result.output)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "unavailable" not in lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def job_count(dsn: str) -> int:
    return int(query(dsn, "SELECT count(*) FROM shardworker.jobs")[0][0])


# rows that exist already ----------------------------------------------------------------


def test_a_worker_fails_and_cancels_jobs_of_an_oversized_queue_and_exits_idle(pg_dsn: str, tmp_path: Path) -> None:
    """The handler's failure and cancellation of a job in a 3 KB queue are written; the worker
    exits 0 on --exit-when-idle, each handler ran once."""
    failed, cancelled, done = (insert_raw(pg_dsn, kind) for kind in ("fail_now", "cancel_me", "count"))
    counts = tmp_path / "counts"
    counts.mkdir()
    proc = start_worker(pg_dsn, tmp_path / "outbox", counts, "--exit-when-idle", procs=1)
    assert exit_code(proc, 60, counts) == 0, worker_log(counts)
    assert dict(query(pg_dsn, "SELECT id, status FROM shardworker.jobs")) == {
        failed: "failed", cancelled: "cancelled", done: "done"}
    assert sorted(runs(counts).values()) == [1, 1, 1]
    assert not list((tmp_path / "outbox").glob("deadletter/*"))


def test_a_peer_rescues_a_dead_workers_job_of_an_oversized_queue(pg_dsn: str, tmp_path: Path) -> None:
    """Worker A is killed -9 holding a job of a 3 KB queue on its last attempt; peer B's rescue
    writes it failed "rescued" (it no longer stays running forever)."""
    job = insert_raw(pg_dsn, "sleepy", max_attempts=1, payload='{"sleep": 120}')
    counts = tmp_path / "counts"
    counts.mkdir()
    a = start_worker(pg_dsn, tmp_path / "a", counts, "--worker-id", "host-a", "--rescue-after", "5",
                     "--shutdown-timeout", "1", procs=1)
    wait_for(lambda: (job, 1) in runs(counts), 30, "A running the job")
    kill_worker_group(a)
    b = start_worker(pg_dsn, tmp_path / "b", counts, "--worker-id", "host-b", "--rescue-after", "5",
                     "--shutdown-timeout", "1", "--rescue-grace", "0", procs=1)
    wait_for(lambda: query(pg_dsn, "SELECT status FROM shardworker.jobs WHERE id = %s", job) == [("failed",)],
             60, "B rescuing the job")
    [(error,)] = query(pg_dsn, "SELECT last_error FROM shardworker.jobs WHERE id = %s", job)
    assert "rescued" in error
    b.send_signal(signal.SIGTERM)
    assert exit_code(b, 30, counts) == 0
    assert runs(counts)[(job, 1)] == 1
    assert "database unavailable" not in worker_log(counts)


def test_a_restarted_worker_requeues_its_orphan_of_an_oversized_queue(pg_dsn: str, tmp_path: Path) -> None:
    """A worker killed -9 holding a job of a 3 KB queue on its last attempt: at its next start
    the orphan requeue writes the job failed, and the worker exits 0 when idle."""
    job = insert_raw(pg_dsn, "sleepy", max_attempts=1, payload='{"sleep": 120}')
    counts = tmp_path / "counts"
    counts.mkdir()
    first = start_worker(pg_dsn, tmp_path / "outbox", counts, procs=1)
    wait_for(lambda: (job, 1) in runs(counts), 30, "the worker running the job")
    kill_worker_group(first)
    again = start_worker(pg_dsn, tmp_path / "outbox", counts, "--exit-when-idle", procs=1)
    assert exit_code(again, 60, counts) == 0, worker_log(counts)
    assert query(pg_dsn, "SELECT status FROM shardworker.jobs WHERE id = %s", job) == [("failed",)]
    assert runs(counts)[(job, 1)] == 1


def test_the_widest_names_fit_the_bounded_indexes(pg_dsn: str) -> None:
    """Names of 4-byte characters, random (so nothing compresses), longer than the 255
    characters the indexes hold: a failed and a cancelled row are written."""
    rng = random.Random(7)

    def wide(n: int) -> str:
        return "".join(chr(rng.randrange(0x10000, 0x10FFFF)) for _ in range(n))

    for status in ("failed", "cancelled"):
        query(pg_dsn, "INSERT INTO shardworker.jobs (kind, queue, status) VALUES (%s, %s, %s) RETURNING id",
              wide(400), wide(400), status)
    assert job_count(pg_dsn) == 2


def test_jobs_cancel_of_an_oversized_queue_job_is_written(pg_dsn: str) -> None:
    job = insert_raw(pg_dsn, "k")
    result = invoke("jobs", "cancel", str(job), "--dsn", pg_dsn)
    assert result.exit_code == 0, result.output
    assert query(pg_dsn, "SELECT status FROM shardworker.jobs WHERE id = %s", job) == [("cancelled",)]


def test_the_queries_that_count_failed_and_cancelled_jobs_still_use_an_index(pg_dsn: str) -> None:
    """stats, `jobs retry --failed --kind` and the dashboard's counts read failed and
    cancelled jobs through the bounded partial indexes, not the whole table."""
    from shardworker.store.sql import query as named

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO shardworker.jobs (kind, queue, status, finished_at) "
                     "SELECT 'k' || (i % 7), 'q' || (i % 3), CASE WHEN i % 100 = 0 THEN 'failed' "
                     "WHEN i % 101 = 0 THEN 'cancelled' ELSE 'done' END, now() - interval '2 hours' "
                     "FROM generate_series(1, 30000) i")
        conn.execute("ANALYZE shardworker.jobs")
        for name, params in (("job_stats_unfinished", None), ("dashboard_kind_counts", None),
                             ("job_failed_ids", {"kind": "k1", "queue": None})):
            plan = "\n".join(r[0] for r in conn.execute(b"EXPLAIN " + named(name).encode(), params).fetchall())
            assert "jobs_failed_bounded_idx" in plan, (name, plan)
            if name != "job_failed_ids":
                assert "jobs_cancelled_bounded_idx" in plan, (name, plan)


# refused at enqueue -----------------------------------------------------------------------


def test_cli_enqueue_refuses_an_oversized_dedupe_key_and_kind_in_one_line(pg_dsn: str, tmp_path: Path) -> None:
    one_line_error(invoke("enqueue", "k", "--dedupe-key", secrets.token_hex(1600), "--dsn", pg_dsn),
                   "dedupe_key", "3200 bytes", "1024")
    one_line_error(invoke("enqueue", "k" * 300, "--dsn", pg_dsn), "kind", "300 bytes", "255")
    one_line_error(invoke("enqueue", "k", "--queue", "é" * 200, "--dsn", pg_dsn), "queue", "400 bytes", "255")
    bulk = tmp_path / "jobs.jsonl"
    bulk.write_text('{"kind": "k"}\n{"kind": "k", "queue": "%s"}\n' % ("q" * 256))
    one_line_error(invoke("enqueue", "--file", str(bulk), "--dsn", pg_dsn), "line 2", "queue", "256 bytes")
    assert job_count(pg_dsn) == 0


def test_the_python_api_refuses_oversized_names_and_keys_on_every_path(pg_dsn: str) -> None:
    cases = [({"kind": "k" * 256}, "kind"), ({"kind": "k", "queue": "q" * 256}, "queue"),
             ({"kind": "k", "dedupe_key": "d" * 1025}, "dedupe_key")]
    for fields, name in cases:
        with pytest.raises(EnqueueError, match=name):
            enqueue(pg_dsn, **fields)
        with pytest.raises(EnqueueError, match=name):
            asyncio.run(enqueue_async(pg_dsn, **fields))
        with pytest.raises(EnqueueError, match=name):
            enqueue_many(pg_dsn, [JobSpec(**fields)])
        with pytest.raises(EnqueueError, match=name):
            asyncio.run(enqueue_many_async(pg_dsn, [JobSpec(**fields)]))
    assert job_count(pg_dsn) == 0
    # At the limits exactly, in multi-byte UTF-8 too, everything is accepted.
    assert enqueue(pg_dsn, "é" * 127 + "k", queue="q" * 255, dedupe_key="€" * 341 + "d") is not None


def test_handler_and_periodic_names_queues_and_worker_ids_are_bounded(tmp_path: Path) -> None:
    app = App()
    with pytest.raises(ConfigError, match=r"kind.*256 bytes"):
        app.handler("k" * 256)
    with pytest.raises(ConfigError, match=r"name.*300 bytes"):
        app.periodic("* * * * *", kind="k", name="n" * 300)
    with pytest.raises(ConfigError, match=r"queue.*256 bytes"):
        app.periodic("* * * * *", kind="k", queue="q" * 256)
    with pytest.raises(ConfigError, match=r"worker_id.*256 bytes"):
        WorkerConfig(dsn="postgresql://x", app_ref="m", outbox_dir=str(tmp_path), worker_id="w" * 256)
    with pytest.raises(ConfigError, match=r"queue.*256 bytes"):
        WorkerConfig(dsn="postgresql://x", app_ref="m", outbox_dir=str(tmp_path), queues=("ok", "q" * 256))


def test_cli_run_refuses_an_oversized_queue_or_worker_id(pg_dsn: str, tmp_path: Path) -> None:
    base = ("run", "--app", "tests.apps.counting_app", "--outbox-dir", str(tmp_path / "o"), "--dsn", pg_dsn,
            "--exit-when-idle")
    one_line_error(invoke(*base, "--queues", "a," + "q" * 300), "queue", "300 bytes", "255")
    one_line_error(invoke(*base, "--worker-id", "w" * 300), "worker_id", "300 bytes", "255")


# the database's refusals are not outages -----------------------------------------------


def test_a_program_limit_or_data_error_is_a_non_retryable_refusal(pg_dsn: str) -> None:
    store = PgStore(StoreConfig(dsn=pg_dsn))
    try:
        with pytest.raises((DataRejected, EnqueueError)) as caught:  # to the store, past the client's checks
            store.enqueue("k", "null", queue="default", priority=0, max_attempts=1, run_at=None, delay_s=0.0,
                          dedupe_key=secrets.token_hex(1650))
        assert not isinstance(caught.value, DatabaseUnavailable) and not is_retryable(caught.value)
        assert "\n" not in str(caught.value)
        job = insert_raw(pg_dsn, "k", queue="q")
        with pytest.raises(DataRejected) as refused, store.cursor() as cur:
            cur.execute("UPDATE shardworker.jobs SET max_attempts = 0 WHERE id = %s", (job,))
        assert not is_retryable(refused.value)
        assert store.stats()  # the connection was not dropped as if the server had gone
    finally:
        store.close()
