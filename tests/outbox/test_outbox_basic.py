"""Behaviour of the outbox on a healthy disk: writing, reading, checkpoints, inspection."""

from __future__ import annotations

import os
import random
import stat
import subprocess
import sys
import textwrap

import orjson
import pytest

import outbox
from outbox import OutboxError, OutboxLocked, OutboxReader, OutboxUnserializable, ShardWriter, WriterConfig
from outbox.frame import HEADER_SIZE, MAX_PAYLOAD_BYTES
from outbox.segment import list_segments, scan_file, segment_name

SMALL = WriterConfig(segment_bytes=4096, reserve_bytes=0)


def read_all(directory: str, *, flush: bool = False) -> list[outbox.Record]:
    """Every record a fresh reader yields; with ``flush``, mark them flushed and checkpoint."""
    with OutboxReader.open(directory) as reader:
        records = drain(reader)
        if flush:
            reader.mark_flushed(records)
            reader.checkpoint()
    return records


def drain(reader: OutboxReader, batch: int = 7) -> list[outbox.Record]:
    """Poll until a poll returns nothing."""
    out: list[outbox.Record] = []
    while chunk := reader.poll(batch):
        out.extend(chunk)
    return out


def values(records: list[outbox.Record], shard: int | None = None) -> list[object]:
    return [r.value() for r in records if shard is None or r.shard == shard]


def write(directory: str, shard: int, items: list[object], config: WriterConfig = SMALL) -> None:
    with ShardWriter.open(directory, shard, config) as w:
        for item in items:
            w.append(item)
            w.commit()


def run_child(code: str) -> None:
    """Run ``code`` in a fresh interpreter (a separate process), failing on a non-zero exit."""
    subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=True, cwd=os.getcwd(),
                   env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(outbox.__file__))})


def die_after_writing(directory: str, shard: int, items: list[object]) -> None:
    """Commit ``items`` from another process that then exits without closing (no seal)."""
    run_child(f"""
        import os
        from outbox import ShardWriter
        w = ShardWriter.open({directory!r}, {shard})
        for item in {items!r}:
            w.append(item)
            w.commit()
        w.append("never committed")
        os._exit(0)
    """)


def append_junk(directory: str, shard: int, segno: int, junk: bytes = b"\x01" * 10) -> None:
    with open(os.path.join(directory, segment_name(shard, segno)), "ab") as f:
        f.write(junk)


def flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x40]))


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


def test_free_bytes_reports_the_file_systems_free_space(tmp_path):
    """free_bytes is the space an unprivileged writer may still use on the directory's file system."""
    vfs = os.statvfs(tmp_path)
    assert abs(outbox.free_bytes(str(tmp_path)) - vfs.f_bavail * vfs.f_frsize) < 64 * 1024 * 1024


def test_tail_records_returns_the_newest_durable_records_across_segments(tmp_path):
    """tail_records gives the last n records of one shard in order, across rotated segments, without a torn tail."""
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
    tail = [orjson.loads(p)["n"] for p in outbox.tail_records(d, 1, 25)]
    assert tail == list(range(35, 60))
    assert [orjson.loads(p)["n"] for p in outbox.tail_records(d, 1, 1000)] == list(range(60))
    assert outbox.tail_records(d, 7, 10) == []


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

    def check_instance() -> None:
        rest = drain(reader)
        ids = [r.value()["id"] for r in yielded + rest]  # type: ignore[index]
        assert len(ids) == len(set(ids))
        assert set(ids) == acked - covered_at_open
        for shard in range(3):
            mine = [r.value()["id"] for r in yielded + rest if r.shard == shard]  # type: ignore[index]
            assert mine == sorted(mine)

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
            check_instance()
            reader.close()
            reader = OutboxReader.open(d)
            covered_at_open, flushed, yielded, pending = set(durable), set(durable), [], []
        else:
            writers[shard].close()
            writers[shard] = ShardWriter.open(d, shard, SMALL)
    check_instance()
    reader.close()
    for w in writers.values():
        w.close()


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


# --- reclaiming applied segments whatever their size ------------------------------------------


def flush_passes(directory: str, passes: int = 3) -> list[outbox.Record]:
    """What a flusher does over a few passes: poll, mark flushed, checkpoint."""
    out: list[outbox.Record] = []
    with OutboxReader.open(directory) as reader:
        for _ in range(passes):
            records = drain(reader)
            reader.mark_flushed(records)
            reader.checkpoint()
            out.extend(records)
    return out


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
