"""``Flusher.run_once`` driven in-process: a real outbox, a real PostgreSQL behind a store
that fails chosen calls (``FlakyStore``), an injected clock and sleep. No processes."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from outbox import OutboxReader, ShardWriter
from shardworker.core import layout, wire
from shardworker.core.model import Disposition, Outcome
from shardworker.errors import OutcomeRejected, StoreError, TransientConflict
from shardworker.flusher.loop import Flusher
from tests.clocks import FakeClock
from tests.flaky_store import FlakyStore
from tests.helpers import enqueue, query, worker_config


def claim_and_write(dsn: str, store: FlakyStore, directory: Path, n: int, shard: int = 0) -> list[int]:
    """Enqueue and claim ``n`` jobs, write a done outcome for each into ``shard``."""
    ids = enqueue(dsn, "k", n)
    jobs = store.claim(["k"], None, "w1", n)
    with ShardWriter.open(str(directory), shard) as writer:
        for job in jobs:
            outcome = Outcome.done(job.id, job.attempt, f'{{"n": {job.id}}}'.encode())
            writer.append_bytes(wire.encode_outcome(outcome))
        writer.commit()
    return ids


def statuses(dsn: str) -> dict[str, int]:
    return dict(query(dsn, "SELECT status, count(*) FROM shardworker.jobs GROUP BY status"))


def make_flusher(directory: Path, store: FlakyStore, clock: FakeClock, **config: Any) -> Flusher:
    return Flusher(OutboxReader.open(str(directory)), store, worker_config(**config).flusher_config(), clock=clock,
                   sleep=clock.sleep)


def test_run_once_applies_a_batch_then_is_idle(pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """One pass applies up to flush_batch outcomes; the next applies the rest; then it is idle."""
    claim_and_write(pg_dsn, store, tmp_path, 30)
    clock = FakeClock()
    flusher = make_flusher(tmp_path, store, clock, flush_batch=20)
    assert flusher.run_once() == 20
    assert statuses(pg_dsn) == {"done": 20, "running": 10}
    assert flusher.run_once() == 10
    assert flusher.run_once() == 0
    assert flusher.idle and flusher.stats.applied == 30
    assert statuses(pg_dsn) == {"done": 30}


def test_run_once_keeps_the_batch_through_failures_and_applies_it_once(
        pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """While the database fails, the same batch is held and retried after a growing sleep; then applied once."""
    claim_and_write(pg_dsn, store, tmp_path, 10)
    clock = FakeClock()
    flusher = make_flusher(tmp_path, store, clock, backoff_base_s=0.1, backoff_cap_s=5.0)
    store.fail("apply_outcomes", times=4)
    for _ in range(4):
        assert flusher.run_once() == 0
        assert flusher.in_hand == 10 and not flusher.idle
    assert statuses(pg_dsn) == {"running": 10}
    assert len(clock.slept) == 4 and clock.slept[-1] > clock.slept[0]
    assert flusher.stats.db_errors == 4
    assert flusher.run_once() == 10
    assert statuses(pg_dsn) == {"done": 10}
    assert flusher.outage.failures == 0


def test_run_once_replays_harmlessly_when_the_commit_reply_was_lost(
        pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """An apply that committed but whose reply was lost is retried: the replay changes nothing."""
    claim_and_write(pg_dsn, store, tmp_path, 5)
    flusher = make_flusher(tmp_path, store, FakeClock())
    store.fail("apply_outcomes", times=1, after=True)
    assert flusher.run_once() == 0
    assert statuses(pg_dsn) == {"done": 5}
    assert flusher.run_once() == 5
    assert (flusher.stats.applied, flusher.stats.replayed) == (0, 5)


def test_a_conflict_is_retried_on_the_fast_policy(pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """A serialization failure waits milliseconds, not the outage backoff."""
    claim_and_write(pg_dsn, store, tmp_path, 3)
    clock = FakeClock()
    flusher = make_flusher(tmp_path, store, clock, backoff_base_s=1.0, backoff_cap_s=5.0)
    store.fail("apply_outcomes", times=3, make=lambda: TransientConflict("deadlock"))
    for _ in range(3):
        flusher.run_once()
    assert max(clock.slept) <= 0.2
    assert flusher.run_once() == 3


def test_a_non_retryable_error_is_raised(pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """An error retrying cannot fix ends the loop (the process restarts it) instead of spinning."""
    claim_and_write(pg_dsn, store, tmp_path, 2)
    flusher = make_flusher(tmp_path, store, FakeClock())
    store.fail("apply_outcomes", times=1, make=lambda: StoreError("permission denied for table jobs"))
    with pytest.raises(StoreError, match="permission denied"):
        flusher.run_once()


def test_a_refused_outcome_is_dead_lettered_and_its_job_failed(pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """When the database refuses one outcome of a batch, the others apply, that one is kept whole in
    deadletter/ and its job fails for good."""
    ids = claim_and_write(pg_dsn, store, tmp_path, 3)
    real = store.store.apply_outcomes

    def refuse_second(outcomes: list[Outcome], steps: Any = (), mark: Any = None) -> Any:
        if any(o.job_id == ids[1] and o.disposition is Disposition.DONE for o in outcomes):
            raise OutcomeRejected("outcome rejected: value too long")
        return real(outcomes, steps, mark)

    store.store.apply_outcomes = refuse_second  # type: ignore[method-assign]
    flusher = make_flusher(tmp_path, store, FakeClock())
    assert flusher.run_once() == 3
    rows = dict(query(pg_dsn, "SELECT id, status FROM shardworker.jobs"))
    assert rows == {ids[0]: "done", ids[1]: "failed", ids[2]: "done"}
    [letter] = os.listdir(layout.deadletter_dir(str(tmp_path)))
    assert str(ids[1]) in (Path(layout.deadletter_dir(str(tmp_path))) / letter).read_text()


def test_an_outcome_refused_even_as_a_failure_is_set_aside_and_the_flusher_goes_on(
        pg_dsn: str, store: FlakyStore, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """When the database refuses one job's outcome and then its substitute failure too, that
    outcome is kept in deadletter/ with one ERROR line and counted; the rest of the batch
    applies, and the next batch flows: no crash loop on a permanent refusal."""
    ids = claim_and_write(pg_dsn, store, tmp_path, 3)
    real = store.store.apply_outcomes

    def refuse_second_always(outcomes: list[Outcome], steps: Any = (), mark: Any = None) -> Any:
        if any(o.job_id == ids[1] for o in outcomes):
            raise OutcomeRejected("outcome rejected: index row size 3056 exceeds btree maximum")
        return real(outcomes, steps, mark)

    store.store.apply_outcomes = refuse_second_always  # type: ignore[method-assign]
    flusher = make_flusher(tmp_path, store, FakeClock())
    with caplog.at_level("ERROR", logger="shardworker.flusher.loop"):
        assert flusher.run_once() == 3
    rows = dict(query(pg_dsn, "SELECT id, status FROM shardworker.jobs"))
    assert rows == {ids[0]: "done", ids[1]: "running", ids[2]: "done"}
    assert flusher.stats.refused == 1
    [letter] = os.listdir(layout.deadletter_dir(str(tmp_path)))
    assert str(ids[1]) in (Path(layout.deadletter_dir(str(tmp_path))) / letter).read_text()
    set_aside = [r for r in caplog.records if "set aside" in r.getMessage()]
    assert len(set_aside) == 1 and str(ids[1]) in set_aside[0].getMessage()
    later = claim_and_write(pg_dsn, store, tmp_path, 2, shard=1)[-2:]
    assert flusher.run_once() == 2
    assert {i: s for i, s in query(pg_dsn, "SELECT id, status FROM shardworker.jobs") if i in later} == {
        later[0]: "done", later[1]: "done"}


def test_checkpoints_follow_the_injected_clock(pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """The checkpoint is written at most every checkpoint_interval_s of the injected clock, and when idle."""
    claim_and_write(pg_dsn, store, tmp_path, 4)
    clock = FakeClock()
    flusher = make_flusher(tmp_path, store, clock, flush_batch=1, checkpoint_interval_s=10.0)
    checkpoint = tmp_path / "checkpoint.json"
    flusher.run_once()
    assert not checkpoint.exists()
    clock.now += 10.0
    flusher.run_once()
    assert checkpoint.exists()
    written = checkpoint.stat().st_mtime_ns
    flusher.run_once()
    assert checkpoint.stat().st_mtime_ns == written  # 0 s of clock since: not again
    flusher.run_once()
    flusher.run_once()  # nothing left: an idle pass writes it at once
    assert checkpoint.stat().st_mtime_ns != written and flusher.idle


def test_parents_applied_segment_and_a_gone_childs_are_deleted(pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """The parent's shard (its writer open, idle) and a shard whose child is gone keep no
    applied outcome: once the flusher applied them, their segments are sealed and deleted."""
    from shardworker.worker.parent_outcomes import ParentOutcomes

    claim_and_write(pg_dsn, store, tmp_path, 5, shard=1)  # the child of shard 1 has exited
    enqueue(pg_dsn, "k", 5)
    parent = ParentOutcomes(str(tmp_path), 1 << 20, {})
    assert parent.fail(store.claim(["k"], None, "w1", 5), "worker process died") == 5
    flusher = make_flusher(tmp_path, store, FakeClock())
    while flusher.run_once() or not flusher.idle:
        pass
    assert statuses(pg_dsn) == {"done": 5, "queued": 5}  # the parent's failures are retried
    parent_first = min(int(p.name[11:21]) for p in tmp_path.glob(f"shard-{layout.PARENT_SHARD}-*.seg"))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and list(tmp_path.glob(f"shard-{layout.PARENT_SHARD}-{parent_first:010d}.seg")):
        parent.flush()  # the dispatcher's pass: nothing waits, so it offers the writer to rotate
        flusher.run_once()
        time.sleep(0.05)
    parent.close()
    while flusher.run_once() or not flusher.idle:
        pass
    flusher.reader.close()
    data = [p.name for p in tmp_path.glob("*.seg") if p.stat().st_size > 50]
    assert data == [], f"applied segments kept: {data}"


def test_an_idle_childs_applied_segment_is_deleted(pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """A child's committer with nothing to commit still lets its applied segment go: within
    a few seconds of the flusher applying it, the segment is sealed and deleted."""
    from shardworker.child.committer import Committer

    enqueue(pg_dsn, "k", 3)
    jobs = store.claim(["k"], None, "w1", 3)
    writer = ShardWriter.open(str(tmp_path), 0)
    committer = Committer(writer, lambda keys, _stats: None, max_records=100, max_delay_s=0.0)
    committer.start()
    committer.expect(len(jobs))
    for job in jobs:
        committer.add((job.id, job.attempt), wire.encode_outcome(Outcome.done(job.id, job.attempt, b"{}")), 0.0)
    first = writer.segno
    flusher = make_flusher(tmp_path, store, FakeClock())
    deadline = time.monotonic() + 30  # a few seconds; a loaded CI machine once took more than 10
    while time.monotonic() < deadline and (tmp_path / f"shard-0000-{first:010d}.seg").exists():
        flusher.run_once()
        time.sleep(0.05)
    committer.stop()
    checkpoint = tmp_path / "checkpoint.json"
    state = (f"writer at segment {writer.segno}; files {sorted(p.name for p in tmp_path.iterdir())}; "
             f"checkpoint {checkpoint.read_text() if checkpoint.exists() else None}")
    writer.close()
    flusher.reader.close()
    assert statuses(pg_dsn) == {"done": 3}
    assert not (tmp_path / f"shard-0000-{first:010d}.seg").exists(), f"the applied segment is kept: {state}"
