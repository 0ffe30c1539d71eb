"""Writing and reading on a healthy disk: round trips, group commit, rotation, live and
dead writers, and values refused at append."""

from __future__ import annotations

import os

import pytest

from outbox import OutboxReader, OutboxUnserializable, ShardWriter
from outbox.frame import HEADER_SIZE, MAX_PAYLOAD_BYTES
from outbox.segment import list_segments, scan_file, segment_name
from tests.outbox.healthy_disk import SMALL, die_after_writing, drain, read_all, values, write


def test_round_trip_keeps_values_and_order_per_shard(tmp_path):
    """Records come back with their values, in append order within each shard."""
    d = str(tmp_path)
    with ShardWriter.open(d, 0) as w0, ShardWriter.open(d, 1) as w1:
        for i in range(20):
            (w0 if i % 3 else w1).append({"i": i, "s": "x" * i})
            if i % 4 == 3:
                w0.commit()
                w1.commit()
        w0.commit()
        w1.commit()
    records = read_all(d)
    assert values(records, 0) == [{"i": i, "s": "x" * i} for i in range(20) if i % 3]
    assert values(records, 1) == [{"i": i, "s": "x" * i} for i in range(20) if not i % 3]
    assert len(records) == 20


def test_group_commit_uses_one_fdatasync_for_many_appends(tmp_path, monkeypatch):
    """A commit of 50 appended records calls os.fdatasync exactly once."""
    d = str(tmp_path)
    with ShardWriter.open(d, 0) as w:
        calls = []
        real = os.fdatasync

        def counting(fd: int) -> None:
            calls.append(fd)
            real(fd)

        monkeypatch.setattr(os, "fdatasync", counting)
        for i in range(50):
            w.append(i)
        assert calls == []
        assert w.commit() == 50
        assert len(calls) == 1
        assert w.commit() == 0  # nothing pending: no sync at all
        assert len(calls) == 1
    assert values(read_all(d)) == list(range(50))


def test_rotation_at_segment_bytes_reads_every_record_once_in_order(tmp_path):
    """Writing well past segment_bytes makes several sealed segments, read once each, in order."""
    d = str(tmp_path)
    items = [{"n": i, "pad": "p" * 150} for i in range(120)]
    write(d, 2, items)
    segs = list_segments(d)[2]
    assert len(segs) >= 5
    for segno in segs:
        scan = scan_file(d, 2, segno)
        assert scan.sealed and scan.state.value == "clean"
        assert scan.size <= SMALL.segment_bytes + HEADER_SIZE  # the seal may follow the last batch
    assert values(read_all(d)) == items


def test_reopen_after_clean_close_starts_a_new_segment(tmp_path):
    """A writer reopened after a clean close starts a fresh segment; nothing is read twice."""
    d = str(tmp_path)
    write(d, 0, ["a", "b"])
    first = list_segments(d)[0]
    old = os.path.join(d, segment_name(0, first[-1]))
    assert scan_file(d, 0, first[-1]).sealed
    size = os.path.getsize(old)
    with ShardWriter.open(d, 0, SMALL) as w:
        assert w.segno == first[-1] + 1
        w.append("c")
        w.commit()
    assert os.path.getsize(old) == size
    assert values(read_all(d)) == ["a", "b", "c"]


def test_reader_follows_a_live_writer_across_commits(tmp_path):
    """One reader sees records committed after its earlier polls, each exactly once."""
    d = str(tmp_path)
    with ShardWriter.open(d, 0, SMALL) as w, OutboxReader.open(d) as reader:
        seen: list[object] = []
        for i in range(60):
            w.append({"i": i, "pad": "q" * 100})
            w.commit()
            if i % 7 == 0:
                seen += values(drain(reader))
        w.close()
        seen += values(drain(reader))
    assert seen == [{"i": i, "pad": "q" * 100} for i in range(60)]


def test_shard_whose_writer_process_died_is_fully_read(tmp_path):
    """A shard whose writer exited without closing is read to its last committed record."""
    d = str(tmp_path)
    die_after_writing(d, 4, [0, 1, 2, 3, 4])
    segs = list_segments(d)[4]
    assert not scan_file(d, 4, segs[-1]).sealed
    assert values(read_all(d)) == [0, 1, 2, 3, 4]
    with ShardWriter.open(d, 4) as w:  # recovery seals it; the records are not read again
        assert scan_file(d, 4, segs[-1]).sealed
        w.append(5)
        w.commit()
    assert values(read_all(d)) == [0, 1, 2, 3, 4, 5]


def test_unserializable_value_raises_and_writes_nothing(tmp_path):
    """A value orjson cannot encode raises OutboxUnserializable; the batch is unchanged."""
    d = str(tmp_path)
    with ShardWriter.open(d, 0) as w:
        w.append("ok")
        size = os.path.getsize(os.path.join(d, segment_name(0, w.segno)))
        with pytest.raises(OutboxUnserializable):
            w.append({"bad": object()})
        with pytest.raises(OutboxUnserializable):
            w.append({1.5: "non-str key"})
        assert w.pending == 1
        assert os.path.getsize(os.path.join(d, segment_name(0, w.segno))) == size
        w.commit()
    assert values(read_all(d)) == ["ok"]


def test_payload_over_the_frame_limit_is_refused(tmp_path):
    """A record too big for one frame is refused at append, not written unreadable."""
    d = str(tmp_path)
    with ShardWriter.open(d, 0) as w:
        with pytest.raises(ValueError, match="MAX_PAYLOAD_BYTES"):
            w.append_bytes(b"x" * (MAX_PAYLOAD_BYTES + 1))
        assert w.pending == 0
