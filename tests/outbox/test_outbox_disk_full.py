"""A full disk (a small tmpfs): commits acknowledge nothing that is not durable, a writer
still seals, and checkpoints fail cleanly or free space first. Each checks exactly-once
delivery of acknowledged records (``tests.outbox.exactly_once``).
"""

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import outbox
from outbox import OutboxReader, ShardWriter, WriterConfig, fsutil
from outbox.segment import list_segments, scan_file, segment_name
from tests.helpers import mounted_tmpfs
from tests.outbox.exactly_once import SMALL, Producer, assert_exactly_once, drain, read_ids

# --- disk full on a small tmpfs --------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: os.PathLike[str]) -> Iterator[str]:
    """A 2 MiB tmpfs, mounted for the test and unmounted after it."""
    with mounted_tmpfs(Path(tmp_path) / "mnt", "2m") as mnt:
        yield str(mnt)


def fill(path: str, leave_bytes: int) -> None:
    """Write zeros to ``path`` until its file system has about ``leave_bytes`` free."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while (free := shutil.disk_usage(os.path.dirname(path)).free) > leave_bytes:
            with contextlib.suppress(OSError):
                os.write(fd, bytes(min(free - leave_bytes, 1 << 20)))
    finally:
        os.close(fd)


def test_disk_full_acknowledges_nothing_undurable_and_recovers(small_disk):
    """On a full disk commit raises OutboxFull and acknowledges nothing; freeing space heals it."""
    d = os.path.join(small_disk, "box")
    filler = os.path.join(small_disk, "filler")
    w = ShardWriter.open(d, 0, WriterConfig(segment_bytes=16 * 1024, reserve_bytes=4096))
    p = Producer(w)
    fill(filler, leave_bytes=96 * 1024)
    for _ in range(200):  # ~220 B records, 10 a batch: 96 KiB lasts about 40 batches
        p.batch(10)
        if p.fulls >= 3:
            break
    assert p.fulls >= 3 and p.acked
    assert sorted(read_ids(d)) == sorted(p.acked)  # nothing of the failed batches is readable
    os.unlink(filler)
    for _ in range(10):
        assert p.batch(10)
    w.close()
    assert_exactly_once(read_ids(d), p.acked, p.attempted)
    assert sorted(read_ids(d)) == sorted(p.acked)
    assert outbox.verify(d).corrupt == []


def test_a_writer_below_the_watermark_still_seals_its_segment(small_disk):
    """The reserve refuses new records but is there for the seal: close() still seals."""
    d = os.path.join(small_disk, "box")
    w = ShardWriter.open(d, 0, WriterConfig(segment_bytes=64 * 1024, reserve_bytes=256 * 1024))
    p = Producer(w)
    assert p.batch(3)
    fill(os.path.join(small_disk, "filler"), leave_bytes=128 * 1024)
    assert not p.batch(3)
    w.close()
    assert scan_file(d, 0, w.segno).sealed
    assert sorted(read_ids(d)) == sorted(p.acked)


def test_disk_filled_between_check_and_write_gives_a_short_write(small_disk, monkeypatch):
    """Another process fills the disk after the free-space check: the short or failed write is
    cut back, OutboxFull raised, the segment stays readable and the next commit starts a new one."""
    d = os.path.join(small_disk, "box")
    filler = os.path.join(small_disk, "filler")
    w = ShardWriter.open(d, 0, WriterConfig(segment_bytes=1024 * 1024, reserve_bytes=0))
    p = Producer(w)
    assert p.batch(5)
    real_free = fsutil.free_bytes
    races = []

    def racing_free_bytes(directory: str) -> int:
        free = real_free(directory)
        if races:
            fill(filler, leave_bytes=races.pop())  # the race: the disk fills after the check
        return free

    monkeypatch.setattr(fsutil, "free_bytes", racing_free_bytes)
    first = w.segno
    before = os.path.getsize(os.path.join(d, segment_name(0, first)))
    races.append(8192)  # room for part of the 40-record batch: a short write
    assert not p.batch(40, pad=400)
    races.append(0)  # no room at all: ENOSPC
    assert not p.batch(40, pad=400)
    assert os.path.getsize(os.path.join(d, segment_name(0, first))) == before
    assert sorted(read_ids(d)) == sorted(p.acked)
    os.unlink(filler)
    assert p.batch(40, pad=400)
    assert w.segno > first
    w.close()
    assert os.path.getsize(os.path.join(d, segment_name(0, first))) == before
    assert_exactly_once(read_ids(d), p.acked, p.attempted)
    assert sorted(read_ids(d)) == sorted(p.acked)


def test_a_flusher_that_read_part_of_a_short_write_still_reads_later_commits(small_disk, monkeypatch):
    """A flusher may read the whole frames of a short write before the writer cuts them off.
    The writer must not write other frames at those offsets: the flusher's cursor is past them."""
    d = os.path.join(small_disk, "box")
    filler = os.path.join(small_disk, "filler")
    w = ShardWriter.open(d, 0, WriterConfig(segment_bytes=1024 * 1024, reserve_bytes=0))
    p = Producer(w)
    reader = OutboxReader.open(d)
    assert p.batch(3)
    seen = [r.value()["id"] for r in reader.poll(1000)]  # type: ignore[index]
    real_free, real_ftruncate = fsutil.free_bytes, os.ftruncate

    def disk_fills_after_the_check(directory: str) -> int:
        free = real_free(directory)
        fill(filler, leave_bytes=8192)  # room for part of the batch: a short write
        return free

    def flusher_reads_before_the_cut(fd: int, length: int) -> None:
        seen.extend(r.value()["id"] for r in reader.poll(1000))  # type: ignore[index]
        real_ftruncate(fd, length)

    monkeypatch.setattr(fsutil, "free_bytes", disk_fills_after_the_check)
    monkeypatch.setattr(os, "ftruncate", flusher_reads_before_the_cut)
    assert not p.batch(40, pad=400)
    monkeypatch.undo()
    assert set(seen) - p.acked, "the flusher did not see the short write: the test proves nothing"
    os.unlink(filler)
    assert p.batch(7, pad=50) and p.batch(5, pad=10)  # frames of other sizes than the cut ones
    w.close()
    seen += [r.value()["id"] for r in drain(reader)]  # type: ignore[index]
    reader.close()
    assert_exactly_once(seen, p.acked, p.attempted)


def test_disk_full_while_starting_a_segment_leaves_no_headerless_segment(small_disk, monkeypatch):
    """A rotation whose new segment header hits ENOSPC raises OutboxFull; the commits after it
    go to a valid segment, so they survive recovery and are read."""
    d = os.path.join(small_disk, "box")
    filler = os.path.join(small_disk, "filler")
    w = ShardWriter.open(d, 0, SMALL)
    p = Producer(w)
    while os.path.getsize(os.path.join(d, segment_name(0, w.segno))) < 3000:
        assert p.batch(2)
    real_free = fsutil.free_bytes
    calls = []

    def racing_free_bytes(directory: str) -> int:
        free = real_free(directory)
        calls.append(directory)
        if len(calls) == 2:  # checks go: seal, new header, batch; fill the disk after the second
            fill(filler, leave_bytes=0)
        return free

    monkeypatch.setattr(fsutil, "free_bytes", racing_free_bytes)
    assert not p.batch(5)  # too big for the segment: seal, then a new segment whose header fails
    monkeypatch.undo()
    os.unlink(filler)
    assert p.batch(3) and p.batch(3)
    w.close()
    ShardWriter.open(d, 0).close()  # recovery: nothing may be quarantined
    assert outbox.verify(d).corrupt == []
    assert_exactly_once(read_ids(d), p.acked, p.attempted)


def test_flusher_checkpoint_on_a_full_disk_fails_and_keeps_the_old_one(small_disk):
    """A checkpoint that cannot be written raises and leaves the previous checkpoint in force."""
    d = os.path.join(small_disk, "box")
    with ShardWriter.open(d, 0, SMALL) as w:
        p = Producer(w)
        assert p.batch(10) and p.batch(10)
    with OutboxReader.open(d) as reader:
        records = drain(reader)
        reader.mark_flushed(records[:10])
        reader.checkpoint()
        reader.mark_flushed(records[10:])
        fill(os.path.join(small_disk, "filler"), leave_bytes=0)
        with pytest.raises(OSError) as err:
            reader.checkpoint()
        assert err.value.errno == errno.ENOSPC
    assert sorted(read_ids(d)) == list(range(10, 20))
    assert not [n for n in os.listdir(d) if n.endswith(".tmp")]


def test_checkpoint_on_a_full_disk_frees_applied_segments_first(small_disk):
    """With the disk full, a checkpoint first deletes the segments whose records are all flushed,
    which makes room for the checkpoint itself: space comes back instead of never being freed."""
    d = os.path.join(small_disk, "box")
    with ShardWriter.open(d, 0, SMALL) as w:
        p = Producer(w)
        for _ in range(12):
            assert p.batch(20)
    assert len(list_segments(d)[0]) >= 4
    with OutboxReader.open(d) as reader:
        records = drain(reader)
        reader.mark_flushed(records)
        fill(os.path.join(small_disk, "filler"), leave_bytes=0)
        reader.checkpoint()
        # All but the newest went; that one (applied, its writer gone) goes behind an empty one.
        assert len(list_segments(d)[0]) <= 2
        assert drain(reader) == []
        reader.checkpoint()
    assert len(list_segments(d)[0]) == 1
    assert read_ids(d) == []
