"""A batch that takes longer than the statement timeout to apply is applied in smaller parts,
and a single record that still does is given a longer timeout, each step said (issue 41, 7: the
same batch was retried for good, reported as an unreachable database). The slowness is real:
another session holds one job's row locked, so applying its outcome waits past the timeout."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest

from outbox import OutboxReader, ShardWriter
from shardworker.core import wire
from shardworker.core.model import Outcome
from shardworker.flusher.loop import Flusher
from shardworker.store.pg_store import PgStore, StoreConfig
from tests.helpers import enqueue, query, worker_config


def test_a_batch_past_the_statement_timeout_lands_in_parts_around_the_slow_record(
        pg_dsn: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ids = enqueue(pg_dsn, "k", 8)
    store = PgStore(StoreConfig(dsn=pg_dsn, statement_timeout_s=0.3))
    jobs = store.claim(["k"], None, "w1", 8, "a" * 32)
    with ShardWriter.open(str(tmp_path), 0) as writer:
        for job in jobs:
            writer.append_bytes(wire.encode_outcome(Outcome.done(job.id, job.attempt, b"1").claimed_by(job)))
        writer.commit()
    locker = psycopg.connect(pg_dsn)
    locker.execute("SELECT 1 FROM shardworker.jobs WHERE id = %s FOR UPDATE", (ids[5],))
    flusher = Flusher(OutboxReader.open(str(tmp_path)), store,
                      worker_config(statement_timeout_s=0.3, backoff_cap_s=0.2).flusher_config())
    try:
        with caplog.at_level("WARNING"):
            for _ in range(12):  # halves, quarters, ... up to the locked row; then a longer timeout
                flusher.run_once()
                if "takes longer than the statement timeout" in caplog.text:
                    break
        # The records before the slow one landed; those after it in its shard wait behind it (in order).
        assert query(pg_dsn, "SELECT id FROM shardworker.jobs WHERE status = 'done' ORDER BY id") == \
            [(i,) for i in ids[:5]]
        assert "applying it in smaller parts" in caplog.text
        assert f"the outcome of job {ids[5]} takes longer than the statement timeout" in caplog.text
        threading.Timer(0.5, locker.rollback).start()  # the lock goes while its longer try waits
        for _ in range(10):
            flusher.run_once()
            if flusher.idle:
                break
        assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE status = 'done'") == [(8,)]
    finally:
        locker.close()
        flusher.reader.close()
        store.close()
