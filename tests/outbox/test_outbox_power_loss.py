"""Power loss: a cut at a random step (after random kill -9s) keeps every acknowledged record."""


import contextlib
import os
import random

import pytest

import outbox
from outbox import (
    OutboxReader,
    ShardWriter,
    fsutil,
)
from tests.outbox.exactly_once import SMALL, assert_exactly_once, drain
from tests.outbox.faultfs import Crash, FaultFS, scratch_dir
from tests.outbox.workload import Workload


@pytest.mark.parametrize("seed", range(150))
def test_power_loss_keeps_every_acknowledged_record(seed, monkeypatch):
    """After a power cut at a random step (after up to three kill -9s of the worker, each at a
    random step), a new reader yields each acknowledged record once."""
    rng = random.Random(seed)
    with scratch_dir() as d:
        crash_at = rng.randint(1, 350)
        die_at = frozenset(rng.sample(range(1, crash_at + 1), min(crash_at, rng.randint(0, 3))))
        eio_at = frozenset(rng.sample(range(1, 80), rng.choice((0, 0, 1, 2))))
        fs = FaultFS(d, rng, crash_at, die_at, eio_at)
        fs.install(monkeypatch)
        work = Workload(d, rng)
        with contextlib.suppress(Crash):
            work.run(steps=70)
        fs.crashed = True
        work.abandon()
        monkeypatch.undo()
        fs.power_loss()

        with OutboxReader.open(d) as reader:
            read = [r.value()["id"] for r in drain(reader)]  # type: ignore[index]
            assert not set(read) & work.checkpointed, "a checkpointed record came back"
            # A checkpoint the crash or a death interrupted may or may not have landed.
            gone = work.checkpointed | (work.maybe_checkpointed - set(read))
            assert_exactly_once(read + sorted(gone), work.acked, work.attempted)
            for shard in (0, 1):  # writers restart: recovery must not bring anything back
                with ShardWriter.open(d, shard, SMALL) as w:
                    w.append({"id": -1 - shard})
                    w.commit()
            assert sorted(r.value()["id"] for r in drain(reader)) == [-2, -1]  # type: ignore[index]
        assert outbox.verify(d).corrupt == []


def test_fault_layer_drops_unsynced_bytes_and_entries(monkeypatch, tmp_path):
    """The fault layer itself: unsynced appends, creates and renames vanish; synced ones stay."""
    d = str(tmp_path)
    with open(os.path.join(d, "old"), "wb") as f:
        f.write(b"old")
    fs = FaultFS(d, random.Random(0), crash_at=10**9)
    fs.install(monkeypatch)
    fd = os.open(os.path.join(d, "a"), os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"synced")
    os.fsync(fd)
    fsutil.fsync_dir(d)
    os.write(fd, b"+lost")
    os.close(fd)
    fd = os.open(os.path.join(d, "b"), os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"b")
    os.fsync(fd)  # content synced, directory entry not
    os.close(fd)
    os.replace(os.path.join(d, "a"), os.path.join(d, "old"))  # rename not synced
    monkeypatch.undo()
    fs.rng = random.Random(1)
    fs.power_loss()
    assert sorted(os.listdir(d)) == ["a", "old"]
    with open(os.path.join(d, "old"), "rb") as f:
        assert f.read() == b"old"
    with open(os.path.join(d, "a"), "rb") as f:
        assert f.read().startswith(b"synced")
