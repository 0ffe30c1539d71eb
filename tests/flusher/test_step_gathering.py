"""The flusher lets step records gather before it applies them: a handler waits on a step's
fsync, never on its row, so steps alone land in few transactions; an outcome, a full batch,
the gather time or a stop apply at once what is held. In-process: a real outbox and
PostgreSQL, an injected clock."""

from __future__ import annotations

import time
from pathlib import Path

from outbox import OutboxReader, ShardWriter
from shardworker.core import wire
from shardworker.core.model import Outcome, StepRecord
from shardworker.flusher.loop import Flusher
from tests.flaky_store import FlakyStore
from tests.flusher.test_flusher_loop import FakeClock, statuses
from tests.helpers import enqueue, query, worker_config

GATHER_S = 0.05


def write(directory: Path, records: list[bytes]) -> None:
    with ShardWriter.open(str(directory), 0) as writer:
        for record in records:
            writer.append_bytes(record)
        writer.commit()


def step(job_id: int, name: str) -> bytes:
    return wire.encode_step(StepRecord(job_id, 1, name, b"1", time.time()))


def step_rows(dsn: str) -> int:
    return int(query(dsn, "SELECT count(*) FROM shardworker.job_steps")[0][0])


def gathering_flusher(directory: Path, store: FlakyStore, clock: FakeClock, **config: object) -> Flusher:
    return Flusher(OutboxReader.open(str(directory)), store, worker_config(**config).flusher_config(), clock=clock,
                   sleep=clock.sleep, gather_steps_s=GATHER_S)


def test_steps_alone_gather_until_the_gather_time_then_land_in_one_transaction(
        pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    (job_id,) = enqueue(pg_dsn, "k", 1)
    store.claim(["k"], None, "w1", 1)
    clock = FakeClock()
    flusher = gathering_flusher(tmp_path, store, clock)
    write(tmp_path, [step(job_id, f"s{i}") for i in range(5)])
    assert flusher.run_once() == 0 and flusher.gathering
    write(tmp_path, [step(job_id, f"s{i}") for i in range(5, 10)])
    clock.now += GATHER_S / 2
    assert flusher.run_once() == 0 and step_rows(pg_dsn) == 0
    clock.now += GATHER_S / 2 + 0.001
    calls = store.calls.get("apply_outcomes", 0)
    assert flusher.run_once() == 10
    assert store.calls["apply_outcomes"] == calls + 1, "the gathered steps landed in more than one transaction"
    assert step_rows(pg_dsn) == 10 and not flusher.gathering
    flusher.reader.close()


def test_an_outcome_applies_the_gathered_steps_with_it_at_once(pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    (job_id,) = enqueue(pg_dsn, "k", 1)
    (job,) = store.claim(["k"], None, "w1", 1)
    flusher = gathering_flusher(tmp_path, store, FakeClock())
    write(tmp_path, [step(job_id, "a"), step(job_id, "b")])
    assert flusher.run_once() == 0
    write(tmp_path, [wire.encode_outcome(Outcome.done(job.id, job.attempt, b"{}"))])
    assert flusher.run_once() == 3
    assert step_rows(pg_dsn) == 2 and statuses(pg_dsn) == {"done": 1}
    flusher.reader.close()


def test_a_full_batch_of_steps_or_a_stop_applies_at_once(pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    (job_id,) = enqueue(pg_dsn, "k", 1)
    store.claim(["k"], None, "w1", 1)
    flusher = gathering_flusher(tmp_path, store, FakeClock(), flush_batch=4)
    write(tmp_path, [step(job_id, f"s{i}") for i in range(6)])
    assert flusher.run_once() == 4  # a full batch goes at once
    assert flusher.run_once() == 0 and flusher.gathering  # the other 2 gather
    flusher.gather = False  # the worker stops: apply what is held
    assert flusher.run_once() == 2 and step_rows(pg_dsn) == 6 and flusher.in_hand == 0
    flusher.reader.close()
