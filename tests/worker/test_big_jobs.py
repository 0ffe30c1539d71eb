"""Big payloads and results: every stage bounded in bytes, nothing lost, nothing re-run.

In-process where the point is a stage's budget (the outbox reader's poll, the flusher's
batches on a real PostgreSQL, the committer's backpressure, the claim statement), and a
real ``shardworker run`` for the whole path."""

from __future__ import annotations

import base64
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from outbox import OutboxReader, ShardWriter
from shardworker.child.committer import Committer
from shardworker.child.handlers import run_sync
from shardworker.core import wire
from shardworker.core.limits import MAX_PAYLOAD_BYTES, MAX_RESULT_BYTES, MiB
from shardworker.core.model import ApplyResult, ClaimedJob, Disposition, Outcome
from shardworker.flusher.loop import Flusher
from shardworker.store.pg_store import PgStore, StoreConfig
from tests.helpers import enqueue, execute, query, runs_per_job, start_worker, worker_config, worker_log


def text_of(size: int, seed: int) -> str:
    """``size`` characters of incompressible ASCII (base64 of random bytes)."""
    return base64.b64encode(os.urandom(size * 3 // 4 + 3)).decode()[:size - 2] + f"{seed % 100:02d}"


@pytest.fixture
def store(pg_dsn: str) -> Any:
    s = PgStore(StoreConfig(dsn=pg_dsn, connect_timeout_s=3, statement_timeout_s=30))
    yield s
    s.close()


# --- the outbox reader ------------------------------------------------------------------


def test_poll_stops_at_its_byte_budget_and_a_bigger_record_comes_alone(tmp_path: Path) -> None:
    sizes = [100, 100, 100, 5000, 100, 100]
    with ShardWriter.open(str(tmp_path), 0) as writer:
        for i, size in enumerate(sizes):
            writer.append_bytes(bytes([i]) * size)
        writer.commit()
    with OutboxReader.open(str(tmp_path)) as reader:
        batches = []
        while batch := reader.poll(100, max_bytes=1000):
            batches.append([len(r.payload) for r in batch])
            reader.mark_flushed(batch)
    assert batches == [[100, 100, 100], [5000], [100, 100]]


# --- the flusher on a real database -----------------------------------------------------


class CountingStore:
    """A real store that remembers the size of each batch it was asked to apply."""

    def __init__(self, store: PgStore) -> None:
        self.store = store
        self.batches: list[list[int]] = []

    def apply_outcomes(self, outcomes: list[Outcome], steps: Any = (), mark: Any = None) -> ApplyResult:
        self.batches.append([o.job_id for o in outcomes])
        return self.store.apply_outcomes(outcomes, steps)


def test_flusher_splits_batches_by_bytes_and_still_applies_them_fenced_and_in_order(
        pg_dsn: str, store: PgStore, tmp_path: Path) -> None:
    """Results of 1-3 MiB under a 4 MiB budget: batches split by bytes, one over the budget
    applied alone, a stale outcome (an attempt that no longer runs) kept out, and every
    result stored byte for byte."""
    ids = enqueue(pg_dsn, "k", 6)
    jobs = store.claim(["k"], None, "w1", 6)
    sizes = [1 * MiB, 1 * MiB, 3 * MiB, 5 * MiB, 2 * MiB, 1 * MiB]
    results = {job.id: text_of(size, job.id) for job, size in zip(jobs, sizes, strict=True)}
    with ShardWriter.open(str(tmp_path), 0) as writer:
        stale = Outcome.done(jobs[0].id, jobs[0].attempt + 7, b'"from another attempt"')
        writer.append_bytes(wire.encode_outcome(stale))
        for job in jobs:
            outcome = Outcome.done(job.id, job.attempt, f'"{results[job.id]}"'.encode())
            writer.append_bytes(wire.encode_outcome(outcome))
        writer.commit()
    counting = CountingStore(store)
    flusher = Flusher(OutboxReader.open(str(tmp_path)), counting, worker_config(flush_bytes=4 * MiB).flusher_config())
    while flusher.run_once():
        pass
    flusher.reader.close()
    # A job's two outcomes in one batch go in two rounds, in order (Flusher._apply).
    assert counting.batches == [[ids[0], ids[1]], [ids[0]], [ids[2]], [ids[3]], [ids[4], ids[5]]]
    assert flusher.stats.applied == 6 and flusher.stats.stale == 1
    rows = dict(query(pg_dsn, "SELECT id, result FROM shardworker.jobs WHERE status = 'done'"))
    assert rows == results


# --- the child's group commit -----------------------------------------------------------


class SlowWriter:
    """A ShardWriter stand-in whose commits wait until the test lets them go."""

    def __init__(self) -> None:
        self.pending: list[bytes] = []
        self.committed: list[int] = []
        self.go = threading.Event()

    def append_bytes(self, record: bytes) -> None:
        self.pending.append(record)

    def commit(self) -> int:
        self.go.wait(10)
        self.committed.append(len(self.pending))
        n, self.pending = len(self.pending), []
        return n

    def reclaim(self) -> bool:  # an idle committer offers this every second
        return False


def test_committer_holds_handlers_back_once_its_byte_budget_waits_behind_a_commit() -> None:
    writer = SlowWriter()
    reported: list[list[wire.JobKey]] = []
    committer = Committer(writer, lambda keys, _stats: reported.append(keys), max_records=100, max_delay_s=0.0,
                          max_bytes=3 * MiB)
    committer.start()
    record = b"x" * MiB
    added: list[int] = []

    def handler_side() -> None:
        committer.expect(10)
        for i in range(10):
            committer.add((i, 1), record, time.monotonic())
            added.append(i)

    thread = threading.Thread(target=handler_side)
    thread.start()
    time.sleep(0.5)
    # The stalled commit holds up to its budget (3 records of 1 MiB), as many wait behind
    # it, and the next add blocks: at most 7 of the 10 are in, and the handler waits.
    assert 4 <= len(added) <= 7 and thread.is_alive(), added
    writer.go.set()
    thread.join(10)
    committer.stop()
    assert added == list(range(10))
    assert sorted(k for keys in reported for k, _ in keys) == list(range(10))
    assert max(writer.committed) <= 3


# --- claims -----------------------------------------------------------------------------


def test_claim_stops_at_its_byte_budget_and_takes_one_bigger_job_alone(pg_dsn: str, store: PgStore) -> None:
    big, small = text_of(2 * MiB, 1), text_of(100, 2)
    ids = [*enqueue(pg_dsn, "k", 1, {"blob": big})]
    for _ in range(4):
        enqueue(pg_dsn, "k", 1, {"blob": small})
    ids = [r[0] for r in query(pg_dsn, "SELECT id FROM shardworker.jobs ORDER BY id")]
    assert [j.id for j in store.claim(["k"], None, "w1", 10, max_bytes=MiB)] == ids[:1]  # alone
    assert [j.id for j in store.claim(["k"], None, "w1", 10, max_bytes=250)] == ids[1:3]
    # A row written before payload_bytes existed is measured by its stored size.
    execute(pg_dsn, "UPDATE shardworker.jobs SET payload_bytes = NULL")
    assert [j.id for j in store.claim(["k"], None, "w1", 10, max_bytes=10 * MiB)] == ids[3:]


def test_enqueue_records_each_payloads_size(pg_dsn: str) -> None:
    enqueue(pg_dsn, "k", 3, {"blob": "x" * 1000})
    from shardworker.client import enqueue as enqueue_one

    enqueue_one(pg_dsn, "k", {"blob": "y" * 10})
    sizes = [r[0] for r in query(pg_dsn, "SELECT payload_bytes FROM shardworker.jobs ORDER BY id")]
    # The JSON text as the client sent it, by COPY and by INSERT alike.
    assert sizes == [len('{"blob":"' + "x" * 1000 + '"}')] * 3 + [len('{"blob":"' + "y" * 10 + '"}')]


# --- limits -----------------------------------------------------------------------------


def test_a_result_over_the_limit_fails_its_job_for_good_with_the_reason() -> None:
    from shardworker import App

    app = App()
    app.handler("huge")(lambda job: "r" * (MAX_RESULT_BYTES + 1))
    outcome = run_sync(app, ClaimedJob(7, "huge", "default", "null", 1, 25))
    assert outcome.disposition is Disposition.FAILED
    assert outcome.error is not None and "handler result too large" in outcome.error
    assert str(MAX_RESULT_BYTES) in outcome.error


def test_a_payload_over_the_limit_fails_in_the_child_without_running_the_handler() -> None:
    from shardworker import App

    app, ran = App(), []
    app.handler("k")(lambda job: ran.append(job.id))
    payload = '"' + "p" * MAX_PAYLOAD_BYTES + '"'
    outcome = run_sync(app, ClaimedJob(8, "k", "default", payload, 1, 25))
    assert ran == [] and outcome.disposition is Disposition.FAILED
    assert outcome.error is not None and outcome.error.startswith("payload too large")


def test_enqueue_refuses_a_payload_over_the_limit_in_one_line(pg_dsn: str) -> None:
    from shardworker.client import enqueue as enqueue_one
    from shardworker.errors import EnqueueError

    with pytest.raises(EnqueueError) as info:
        enqueue_one(pg_dsn, "k", "p" * MAX_PAYLOAD_BYTES)
    assert "payload too large" in str(info.value) and "\n" not in str(info.value)
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs") == [(0,)]


# --- the whole path ---------------------------------------------------------------------


def test_a_worker_moves_big_payloads_and_results_whole_and_runs_each_once(
        pg_dsn: str, tmp_path: Path) -> None:
    """24 jobs of 1.5 MiB payloads echoed back as results: more than one claim, prefetch,
    commit and flush budget of bytes each, through a real ``shardworker run``."""
    outbox_dir, count_dir = tmp_path / "outbox", tmp_path / "counts"
    count_dir.mkdir()
    blobs = [text_of(3 * MiB // 2, i) for i in range(24)]
    from shardworker.client import JobSpec, enqueue_many

    enqueue_many(pg_dsn, [JobSpec("count", {"blob": b}) for b in blobs])
    proc = start_worker(pg_dsn, outbox_dir, count_dir, "--exit-when-idle", procs=2)
    assert proc.wait(120) == 0, worker_log(count_dir)
    rows = query(pg_dsn, "SELECT id, status, result FROM shardworker.jobs ORDER BY id")
    assert [r[1] for r in rows] == ["done"] * 24
    assert [r[2]["echo"]["blob"] for r in rows] == blobs
    assert set(runs_per_job(count_dir).values()) == {1} and len(runs_per_job(count_dir)) == 24
