"""Read-only inspection of an outbox: status, verify, records_since and free_bytes."""

from __future__ import annotations

import os
import time

import orjson
import pytest

import outbox
from outbox import OutboxReader, ShardWriter, WriterConfig
from outbox.frame import HEADER_SIZE
from outbox.segment import list_segments, segment_name
from tests.outbox.healthy_disk import SMALL, drain, flip_byte, read_all, write


def test_status_counts_pending_records_bytes_and_oldest_age(tmp_path):
    """status() reports records after the checkpoint, their framed size and the oldest's age."""
    d = str(tmp_path)
    write(d, 0, ["aaaa", "bb"])
    write(d, 1, ["c"])
    records = read_all(d)
    st = outbox.status(d)
    assert [s.shard for s in st.shards] == [0, 1]
    assert st.pending == 3
    assert st.shards[0].pending_bytes == 2 * HEADER_SIZE + len(b'"aaaa"') + len(b'"bb"')
    oldest = min(r.ts_ms for r in records if r.shard == 0) / 1000
    assert outbox.status(d, now=oldest + 100).shards[0].oldest_age_s == pytest.approx(100)
    assert not st.shards[0].writer_alive and not st.flusher_alive
    with OutboxReader.open(d) as reader:
        reader.mark_flushed([r for r in drain(reader) if r.shard == 0])
        reader.checkpoint()
        after = outbox.status(d)
        assert after.flusher_alive
    assert (after.shards[0].pending, after.shards[0].oldest_age_s, after.shards[1].pending) == (0, None, 1)
    with ShardWriter.open(d, 1):
        assert outbox.status(d).shards[1].writer_alive


def test_verify_reports_clean_sealed_segments_and_a_corrupt_one(tmp_path):
    """verify() counts records per segment and flags a segment with a flipped byte mid-file."""
    d = str(tmp_path)
    write(d, 0, list(range(3)))
    write(d, 1, list(range(4)))
    report = outbox.verify(d)
    assert [(s.path, s.state, s.sealed, s.records) for s in report.segments] == [
        (segment_name(0, 1), "clean", True, 3), (segment_name(1, 1), "clean", True, 4)]
    assert report.corrupt == [] and report.torn == []
    flip_byte(os.path.join(d, segment_name(1, 1)), HEADER_SIZE + 3)  # valid frames follow
    bad = outbox.verify(d).corrupt
    assert [(s.path, s.state, s.bad_offset) for s in bad] == [(segment_name(1, 1), "corrupt", HEADER_SIZE)]


def test_status_counts_sealed_segments(tmp_path) -> None:
    """status() counts rotated segments as sealed, the live one not, and all of them after a clean close."""
    directory = str(tmp_path / "ob")
    writer = ShardWriter.open(directory, 0, WriterConfig(segment_bytes=4096))
    for i in range(200):
        writer.append({"i": i, "pad": "x" * 40})
        writer.commit()
    [live] = outbox.status(directory).shards
    assert live.segments >= 3 and live.sealed_segments == live.segments - 1
    writer.close()
    [closed] = outbox.status(directory).shards
    assert closed.sealed_segments == closed.segments


def test_records_since_reads_the_segments_written_since_a_moment(tmp_path):
    """records_since gives a shard's records in order, across rotated segments, from the
    segments modified since the moment on, without a torn tail."""
    d = str(tmp_path)
    with ShardWriter.open(d, 1, SMALL) as w:
        for n in range(60):  # 60 x ~200 bytes: several 4 KiB segments
            w.append({"n": n, "pad": "x" * 180})
            w.commit()
    with ShardWriter.open(d, 2, SMALL) as other:
        other.append({"n": "other shard"})
        other.commit()
    segs = list_segments(d)[1]
    assert len(segs) >= 3
    with open(os.path.join(d, segment_name(1, segs[-1])), "ab") as f:
        f.write(b"\x07torn")
    assert [orjson.loads(p)["n"] for p in outbox.records_since(d, 1, 0.0)] == list(range(60))
    # Segments last written before the moment are not read.
    old = time.time() - 3600
    for segno in segs[:-2]:
        os.utime(os.path.join(d, segment_name(1, segno)), (old, old))
    recent = [orjson.loads(p)["n"] for p in outbox.records_since(d, 1, time.time() - 60)]
    assert recent and recent == list(range(60 - len(recent), 60)) and len(recent) < 60
    assert outbox.records_since(d, 7, 0.0) == []


def test_free_bytes_reports_the_file_systems_free_space(tmp_path):
    """free_bytes is the space an unprivileged writer may still use on the directory's file system."""
    vfs = os.statvfs(tmp_path)
    assert abs(outbox.free_bytes(str(tmp_path)) - vfs.f_bavail * vfs.f_frsize) < 64 * 1024 * 1024
