"""Who may touch an outbox: one flusher per directory, one writer per shard, no writing
after close, and files private to their owner."""

from __future__ import annotations

import os
import stat

import pytest

from outbox import OutboxError, OutboxLocked, OutboxReader, ShardWriter
from outbox.segment import list_segments
from tests.outbox.healthy_disk import append_junk, die_after_writing, read_all, values, write


def test_second_reader_on_the_same_directory_is_locked_out(tmp_path):
    """Only one flusher per directory: a second OutboxReader.open raises OutboxLocked."""
    d = str(tmp_path)
    with OutboxReader.open(d), pytest.raises(OutboxLocked):
        OutboxReader.open(d)
    OutboxReader.open(d).close()  # released on close


def test_second_writer_for_the_same_shard_is_locked_out(tmp_path):
    """Only one writer per shard: a second ShardWriter.open raises OutboxLocked; others are fine."""
    d = str(tmp_path)
    with ShardWriter.open(d, 3):
        with pytest.raises(OutboxLocked):
            ShardWriter.open(d, 3)
        ShardWriter.open(d, 4).close()
    ShardWriter.open(d, 3).close()


def test_a_closed_writer_refuses_to_commit(tmp_path):
    """After close() (its lock released) a writer writes nothing: another may own the shard now."""
    d = str(tmp_path)
    w = ShardWriter.open(d, 0)
    w.close()
    with ShardWriter.open(d, 0) as other:
        w.append("stale")
        with pytest.raises(OutboxError, match="closed"):
            w.commit()
        other.append("fresh")
        other.commit()
    assert values(read_all(d)) == ["fresh"]
    assert list_segments(d)[0] == [1, 2]


def test_files_are_0600_and_directories_0700(tmp_path):
    """Everything the outbox creates, torn/ and quarantine/ included, is private to its owner."""
    d = str(tmp_path / "box")
    os.makedirs(d, mode=0o755)
    os.chmod(d, 0o755)
    write(d, 0, list(range(5)))
    read_all(d, flush=True)
    die_after_writing(d, 1, list(range(5)))
    for shard in (0, 1):  # junk after the seal: quarantine; junk after a dead writer's data: torn
        append_junk(d, shard, list_segments(d)[shard][-1])
        ShardWriter.open(d, shard).close()
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert os.listdir(os.path.join(d, "torn")) and os.listdir(os.path.join(d, "quarantine"))
    for root, dirs, files in os.walk(d):
        for name in dirs:
            assert stat.S_IMODE(os.stat(os.path.join(root, name)).st_mode) == 0o700, name
        for name in files:
            assert stat.S_IMODE(os.stat(os.path.join(root, name)).st_mode) == 0o600, name
