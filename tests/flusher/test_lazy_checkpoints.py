"""A worker's flusher and its checkpoints (``Flusher(lazy_checkpoints=True)``): written once
the outbox is quiet, at the interval while outcomes keep coming, at once when stopping
(``finish``), and after a refusal not before the interval. A real outbox, a real PostgreSQL,
an injected clock; a full disk is a small tmpfs."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import pytest

from outbox import OutboxReader, ShardWriter
from shardworker.core import wire
from shardworker.core.model import Outcome
from shardworker.flusher.loop import QUIET_CHECKPOINT_S, Flusher
from tests.flaky_store import FlakyStore
from tests.flusher.test_flusher_loop import FakeClock, statuses
from tests.helpers import enqueue, mounted_tmpfs, worker_config


def lazy_flusher(directory: Path, store: FlakyStore, clock: FakeClock, interval_s: float) -> Flusher:
    """A worker's flusher (``lazy_checkpoints``) on ``directory``, checkpoint_interval_s ``interval_s``."""
    config = worker_config(checkpoint_interval_s=interval_s).flusher_config()
    return Flusher(OutboxReader.open(str(directory)), store, config, clock=clock, sleep=clock.sleep,
                   lazy_checkpoints=True)


def test_a_worker_flusher_caught_up_checkpoints_once_quiet_or_when_stopping(
        pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """A worker's flusher (``lazy_checkpoints``), which outcomes reach a few at a time and
    which catches up after nearly every batch, does not write a checkpoint each time it
    catches up (two fsyncs ahead of the next batch): only once nothing more has come for
    QUIET_CHECKPOINT_S (or checkpoint_interval_s has passed), or at once when a stop comes
    (``gather`` False). Caught up, it is not yet idle until then."""
    enqueue(pg_dsn, "k", 4)
    jobs = store.claim(["k"], None, "w1", 4)
    clock = FakeClock()
    flusher = lazy_flusher(tmp_path, store, clock, 10.0)
    checkpoint = tmp_path / "checkpoint.json"
    with ShardWriter.open(str(tmp_path), 0) as writer:  # a child's, open all along

        def finish(*done: Any) -> None:
            for job in done:
                writer.append_bytes(wire.encode_outcome(Outcome.done(job.id, job.attempt, b"1")))
            writer.commit()

        assert flusher.run_once() == 0  # (the reader's first pass reaches the writer's segment: a checkpoint)
        written = checkpoint.read_bytes()
        finish(*jobs[:2])
        assert flusher.run_once() == 2
        assert flusher.run_once() == 0
        assert flusher.caught_up and not flusher.idle and checkpoint.read_bytes() == written
        assert flusher.checkpoint_due_in() == pytest.approx(QUIET_CHECKPOINT_S)
        clock.now += QUIET_CHECKPOINT_S / 2
        finish(jobs[2])  # more came before it was quiet: caught up again, the wait starts again
        assert flusher.run_once() == 1 and not flusher.caught_up
        assert flusher.run_once() == 0 and checkpoint.read_bytes() == written
        assert flusher.checkpoint_due_in() == pytest.approx(QUIET_CHECKPOINT_S)
        clock.now += QUIET_CHECKPOINT_S * 1.01
        assert flusher.run_once() == 0
        assert checkpoint.read_bytes() != written and flusher.idle and flusher.checkpoint_due_in() == float("inf")
        written = checkpoint.read_bytes()
        finish(jobs[3])
        assert flusher.run_once() == 1
        assert flusher.run_once() == 0 and flusher.caught_up and checkpoint.read_bytes() == written
        flusher.gather = False  # the worker stops
        assert flusher.run_once() == 0
        assert flusher.idle and checkpoint.read_bytes() != written
    assert statuses(pg_dsn) == {"done": 4}


def test_a_checkpoint_the_full_disk_refuses_is_tried_again_after_the_interval_not_at_every_pass(
        pg_dsn: str, store: FlakyStore, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The outbox on a 2 MiB tmpfs, filled after a batch: the checkpoint fails with ENOSPC
    (the outcomes are applied; a stale checkpoint only costs replays). The passes after it
    wait checkpoint_interval_s before trying again, instead of retrying (and logging) at each
    pass; once space is back, the next try after the interval writes it."""
    with mounted_tmpfs(tmp_path / "mnt", "2m") as mnt:
        directory = mnt / "outbox"
        enqueue(pg_dsn, "k", 1)
        (job,) = store.claim(["k"], None, "w1", 1)
        clock = FakeClock()
        flusher = lazy_flusher(directory, store, clock, 1.0)
        with ShardWriter.open(str(directory), 0) as writer:
            assert flusher.run_once() == 0  # the first checkpoint, while there is room
            writer.append_bytes(wire.encode_outcome(Outcome.done(job.id, job.attempt, b"1")))
            writer.commit()
            assert flusher.run_once() == 1
            assert flusher.run_once() == 0 and flusher.caught_up  # the checkpoint waits for quiet
            filler = mnt / "filler"
            fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                for size in (64 * 1024, 4096, 512, 1):  # down to the last byte
                    with contextlib.suppress(OSError):
                        while True:
                            os.write(fd, bytes(size))
            finally:
                os.close(fd)
            clock.now += 2 * QUIET_CHECKPOINT_S
            with caplog.at_level("WARNING", logger="shardworker.flusher.loop"):
                for _ in range(5):  # quiet, caught up: the checkpoint is due, and the disk refuses it
                    assert flusher.run_once() == 0
            failures = [r for r in caplog.records if "checkpoint not written" in r.getMessage()]
            assert len(failures) == 1 and not flusher.idle
            assert flusher.checkpoint_due_in() == pytest.approx(1.0)
            filler.unlink()
            clock.now += 1.0
            assert flusher.run_once() == 0 and flusher.idle
    assert statuses(pg_dsn) == {"done": 1}


def test_a_stop_during_a_caught_up_pass_still_writes_the_checkpoint(pg_dsn: str, store: FlakyStore,
                                                                     tmp_path: Path) -> None:
    """The stop came after the pass began (so the pass put the checkpoint off): ``finish``,
    which the flusher's process calls on its way out, writes it."""
    enqueue(pg_dsn, "k", 1)
    (job,) = store.claim(["k"], None, "w1", 1)
    clock = FakeClock()
    flusher = lazy_flusher(tmp_path, store, clock, 10.0)
    checkpoint = tmp_path / "checkpoint.json"
    with ShardWriter.open(str(tmp_path), 0) as writer:  # a child's, open all along
        assert flusher.run_once() == 0
        written = checkpoint.read_bytes()
        writer.append_bytes(wire.encode_outcome(Outcome.done(job.id, job.attempt, b"1")))
        writer.commit()
        assert flusher.run_once() == 1
        assert flusher.run_once() == 0 and flusher.caught_up and not flusher.idle
        assert checkpoint.read_bytes() == written
        flusher.finish()
        assert flusher.idle and checkpoint.read_bytes() != written
