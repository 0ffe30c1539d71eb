"""Flushing, checkpoints and reclaiming space on a healthy disk: what a new reader yields
again, which segments a checkpoint deletes, and segment numbers that never go back."""

from __future__ import annotations

import os
import random

import pytest

import outbox
from outbox import OutboxReader, ShardWriter, WriterConfig
from outbox.frame import HEADER_SIZE
from outbox.segment import list_segments, scan_file, segment_name
from tests.outbox.healthy_disk import (
    SMALL,
    die_after_writing,
    drain,
    flip_byte,
    flush_passes,
    read_all,
    values,
    write,
)


def test_flushed_and_checkpointed_records_are_not_yielded_again(tmp_path):
    """After mark_flushed + checkpoint, a new reader yields only records not flushed."""
    d = str(tmp_path)
    write(d, 0, list(range(30)))
    with OutboxReader.open(d) as reader:
        records = drain(reader)
        reader.mark_flushed(records[:12])
        reader.checkpoint()
    assert values(read_all(d)) == list(range(12, 30))


def test_records_not_marked_flushed_are_replayed_by_a_new_reader(tmp_path):
    """Records yielded but never marked flushed come back from a new reader (a replay)."""
    d = str(tmp_path)
    write(d, 0, list(range(10)))
    with OutboxReader.open(d) as reader:
        assert values(drain(reader)) == list(range(10))
        reader.checkpoint()
    assert values(read_all(d)) == list(range(10))


def test_checkpoint_deletes_only_sealed_fully_flushed_segments(tmp_path):
    """Segments go only when sealed and fully flushed; each shard keeps its newest segment
    (a writerless shard's, once applied, behind an empty sealed one that keeps its number)."""
    d = str(tmp_path)
    write(d, 0, [{"n": i, "pad": "z" * 300} for i in range(40)])
    segs = list_segments(d)[0]
    assert len(segs) >= 3
    with OutboxReader.open(d) as reader:
        records = drain(reader)
        first_seg = [r for r in records if r.segno == segs[0]]
        reader.mark_flushed(first_seg[:-1])  # all but the last record of the first segment
        assert reader.checkpoint() == 0
        assert list_segments(d)[0] == segs
        reader.mark_flushed(records[len(first_seg) - 1 :])
        deleted = reader.checkpoint()
    assert deleted == len(segs) - 1
    assert list_segments(d)[0] == [segs[-1], segs[-1] + 1]
    assert read_all(d, flush=True) == []
    assert list_segments(d)[0] == [segs[-1] + 1]


def test_checkpoint_keeps_the_segment_a_live_writer_appends_to(tmp_path):
    """A segment still open for writing is not deleted, even when all its records are flushed."""
    d = str(tmp_path)
    with ShardWriter.open(d, 0, SMALL) as w:
        w.append("x")
        w.commit()
        read_all(d, flush=True)
        assert os.path.exists(os.path.join(d, segment_name(0, w.segno)))
        w.append("y")
        w.commit()
    assert values(read_all(d)) == ["y"]


def test_quarantined_segment_number_is_never_reused(tmp_path):
    """After recovery quarantines a shard's newest segment, the next segment gets a new number.

    Reusing it would make a reader whose cursor sits in the old file skip the new records.
    """
    d = str(tmp_path)
    die_after_writing(d, 0, ["a", "b", "c"])
    with OutboxReader.open(d) as reader:
        assert values(drain(reader)) == ["a", "b", "c"]
        flip_byte(os.path.join(d, segment_name(0, 1)), HEADER_SIZE + 2)
        with ShardWriter.open(d, 0) as w:
            assert w.segno == 2
            w.append("d")
            w.commit()
        assert values(drain(reader)) == ["d"]
    assert os.listdir(os.path.join(d, "quarantine")) == [segment_name(0, 1)]
    flip_byte(os.path.join(d, segment_name(0, 2)), HEADER_SIZE + 2)
    ShardWriter.open(d, 0).close()
    assert sorted(os.listdir(os.path.join(d, "quarantine"))) == [segment_name(0, 1), segment_name(0, 2)]


def test_segment_left_empty_by_a_dying_writer_keeps_its_number(tmp_path):
    """A segment file created by a writer that died before its header is sealed, not freed.

    Freeing it would restart the shard at segment 1, behind the reader's checkpoint.
    """
    d = str(tmp_path)
    write(d, 0, ["a"])
    read_all(d, flush=True)  # the checkpoint now points at segment 2
    fd = os.open(os.path.join(d, segment_name(0, 2)), os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(fd)  # what a writer killed between creating segment 2 and writing its header leaves
    read_all(d, flush=True)  # deletes segment 1: segment 2 is now the newest
    assert list_segments(d)[0] == [2]
    with ShardWriter.open(d, 0) as w:
        assert w.segno == 3
        w.append("b")
        w.commit()
    assert scan_file(d, 0, 2).sealed
    assert values(read_all(d)) == ["b"]


def check_instance(reader: OutboxReader, yielded: list[outbox.Record], acked: set[int],
                   covered_at_open: set[int]) -> None:
    """The reader instance yields, with what it yielded so far, every acknowledged record its
    checkpoint did not cover, each once, in order per shard."""
    rest = drain(reader)
    ids = [r.value()["id"] for r in yielded + rest]  # type: ignore[index]
    assert len(ids) == len(set(ids))
    assert set(ids) == acked - covered_at_open
    for shard in range(3):
        mine = [r.value()["id"] for r in yielded + rest if r.shard == shard]  # type: ignore[index]
        assert mine == sorted(mine)


@pytest.mark.parametrize("seed", range(10))
def test_reader_yields_each_record_once_across_partial_flushes_checkpoints_and_restarts(tmp_path, seed):
    """With random polls, partial mark_flushed calls, checkpoints and reader restarts beside
    live writers, every reader instance yields exactly the records its checkpoint did not
    cover, each once, in order per shard."""
    d, rng = str(tmp_path), random.Random(seed)
    writers = {s: ShardWriter.open(d, s, SMALL) for s in range(3)}
    acked: set[int] = set()
    flushed: set[int] = set()  # marked flushed by the current reader
    durable: set[int] = set()  # covered by the last checkpoint
    reader = OutboxReader.open(d)
    covered_at_open: set[int] = set()
    yielded: list[outbox.Record] = []
    pending: list[outbox.Record] = []
    next_id = 0

    for _ in range(150):
        roll, shard = rng.random(), rng.randrange(3)
        if roll < 0.45:
            for _ in range(rng.randint(1, 6)):
                writers[shard].append({"id": next_id, "pad": "w" * rng.randint(0, 400)})
                acked.add(next_id)
                next_id += 1
            writers[shard].commit()
        elif roll < 0.65:
            got = reader.poll(rng.randint(1, 20))
            yielded += got
            pending += got
        elif roll < 0.8:
            n = rng.randint(0, len(pending))
            reader.mark_flushed(pending[:n])
            flushed |= {r.value()["id"] for r in pending[:n]}  # type: ignore[index]
            pending = pending[n:]
        elif roll < 0.9:
            reader.checkpoint()
            durable = set(flushed)
        elif roll < 0.95:
            check_instance(reader, yielded, acked, covered_at_open)
            reader.close()
            reader = OutboxReader.open(d)
            covered_at_open, flushed, yielded, pending = set(durable), set(durable), [], []
        else:
            writers[shard].close()
            writers[shard] = ShardWriter.open(d, shard, SMALL)
    check_instance(reader, yielded, acked, covered_at_open)
    reader.close()
    for w in writers.values():
        w.close()


# --- reclaiming applied segments whatever their size ------------------------------------------


@pytest.mark.parametrize("left", ["closed", "killed"])
def test_applied_segment_of_a_shard_without_writer_is_reclaimed(tmp_path, left):
    """A shard whose writer is gone (closed, or killed unsealed) keeps no applied record: its
    newest segment is sealed, an empty one takes its number, and a later writer goes on after it."""
    d = str(tmp_path)
    items = [{"n": i, "pad": "p" * 500} for i in range(5)]
    if left == "closed":
        write(d, 7, items, WriterConfig())
    else:
        die_after_writing(d, 7, items)
    assert [r.value() for r in flush_passes(d)] == items
    (only,) = list_segments(d)[7]
    assert os.path.getsize(os.path.join(d, segment_name(7, only))) == 2 * HEADER_SIZE
    write(d, 7, ["after"], WriterConfig())
    assert values(flush_passes(d)) == ["after"]
    assert min(list_segments(d)[7]) > only


def test_idle_writer_rotates_its_applied_segment_so_it_is_deleted(tmp_path):
    """A live writer's current segment, once every record in it is applied, is sealed by
    ``reclaim`` and then deleted by the flusher; records written after it are still read."""
    d = str(tmp_path)
    with ShardWriter.open(d, 2, WriterConfig(reclaim_check_s=0)) as w:
        for i in range(3):
            w.append({"n": i, "pad": "q" * 2000})
        w.commit()
        first = w.segno
        assert not w.reclaim(), "rotated before the flusher applied the records"
        with OutboxReader.open(d) as reader:
            reader.mark_flushed(drain(reader))
            reader.checkpoint()
            assert w.reclaim()
            assert w.segno > first
            assert drain(reader) == []
            reader.checkpoint()
            assert first not in list_segments(d)[2]
            w.append("later")
            w.commit()
            assert values(drain(reader)) == ["later"]


def test_busy_writer_seals_at_reclaim_bytes_once_the_flusher_reads_its_segment(tmp_path):
    """While the flusher keeps up, a writer starts a new segment every ``reclaim_bytes``, far
    below ``segment_bytes``, so the flusher can delete what it applied."""
    d = str(tmp_path)
    config = WriterConfig(segment_bytes=64 * 1024 * 1024, reclaim_bytes=16 * 1024, reclaim_check_s=0)
    with ShardWriter.open(d, 1, config) as w, OutboxReader.open(d) as reader:
        for i in range(40):
            w.append({"n": i, "pad": "r" * 1000})
            w.commit()
            reader.mark_flushed(drain(reader))
            reader.checkpoint()
        held = sum(os.path.getsize(os.path.join(d, segment_name(1, s))) for s in list_segments(d)[1])
    assert held < 2 * 16 * 1024 + 2048, f"{held} bytes of applied records kept"


def test_applied_sealed_segment_is_retired_without_being_read_again(tmp_path):
    """A closed writer's segment, read to its seal and applied, is retired as it is: not read
    again (at a worker's exit that read every record of the shard once more). A byte flipped
    after the reader read it shows it: a second read would quarantine the segment."""
    d = str(tmp_path)
    items = [{"n": i, "pad": "p" * 500} for i in range(5)]
    write(d, 7, items, WriterConfig())
    (segno,) = list_segments(d)[7]
    with OutboxReader.open(d) as reader:
        records = drain(reader)
        reader.mark_flushed(records)
        flip_byte(os.path.join(d, segment_name(7, segno)), 3 * HEADER_SIZE + 100)
        reader.checkpoint()
        reader.checkpoint()
    assert values(records) == items
    assert not os.path.exists(os.path.join(d, "quarantine"))
    assert min(list_segments(d)[7]) > segno  # retired, then deleted as applied
