"""The kept tail (``outbox.tail``): applied segments kept for a window and a byte cap, shown by
``status``, and read again after ``rewind`` (for a database that comes back older)."""

from __future__ import annotations

import os
import time

import outbox
import outbox.tail as outbox_tail
from outbox import Keep, OutboxReader, Position
from outbox.segment import list_segments, segment_name
from tests.outbox.healthy_disk import drain, values, write

HOUR = Keep(seconds=3600, max_bytes=1 << 30)


def _flush_all(d: str, keep: Keep) -> list[outbox.Record]:
    with OutboxReader.open(d, keep) as reader:
        records = drain(reader)
        reader.mark_flushed(records)
        reader.checkpoint()
        reader.checkpoint()  # the second deletes what the first retired (an applied, writerless shard)
    return records


def _age(d: str, shard: int, segno: int, seconds: float) -> None:
    path = os.path.join(d, segment_name(shard, segno))
    then = os.stat(path).st_mtime - seconds
    os.utime(path, (then, then))


def test_without_a_keep_applied_segments_go(tmp_path):
    """The default keeps nothing: every applied segment but the newest is deleted."""
    d = str(tmp_path)
    write(d, 0, [{"n": i, "pad": "z" * 300} for i in range(40)])
    _flush_all(d, Keep())
    assert len(list_segments(d)[0]) == 1


def test_applied_segments_stay_within_the_window_and_show_as_kept(tmp_path):
    """Within the window every applied segment stays; status counts them as kept, not pending."""
    d = str(tmp_path)
    write(d, 0, [{"n": i, "pad": "z" * 300} for i in range(40)])
    before = list_segments(d)[0]
    _flush_all(d, HOUR)
    assert set(before) <= set(list_segments(d)[0])
    st = outbox.status(d)
    assert st.pending == 0
    assert st.kept_segments >= len(before) and st.kept_bytes > 40 * 300
    assert st.kept_oldest_age_s is not None and st.kept_oldest_age_s < 60
    assert outbox.kept_records(d) == 40


def test_segments_past_the_window_or_the_byte_cap_go_oldest_first(tmp_path, monkeypatch):
    """A segment applied longer ago than the window goes (its window counts from when it was
    applied, not written); then the oldest go until the rest fit the cap."""
    d = str(tmp_path)
    write(d, 0, [{"n": i, "pad": "z" * 300} for i in range(40)])
    segs = list_segments(d)[0]
    _age(d, 0, segs[0], 7200)
    _flush_all(d, HOUR)
    assert set(segs) <= set(list_segments(d)[0])  # written two hours ago, applied now: kept
    with OutboxReader.open(d, HOUR) as reader:
        reader.checkpoint()  # this reader found them finished now
        later = time.time() + 3700
        monkeypatch.setattr(outbox_tail.time, "time", lambda: later)
        reader.checkpoint()
    assert list_segments(d)[0] == [max(list_segments(d)[0])]  # all past the window: only the newest stays
    write(d, 0, [{"n": i, "pad": "z" * 300} for i in range(40)])
    _flush_all(d, HOUR)
    size = os.path.getsize(os.path.join(d, segment_name(0, list_segments(d)[0][0])))
    with OutboxReader.open(d, Keep(seconds=3600, max_bytes=2 * size)) as reader:
        reader.checkpoint()
    kept = list_segments(d)[0]
    assert len(kept) <= 4 and kept[-1] == max(list_segments(d)[0])  # about two kept, and the newest


def test_the_disk_watermark_takes_the_kept_tail_first(tmp_path):
    """With less free space than twice the watermark, kept segments go whatever the window says."""
    d = str(tmp_path)
    write(d, 0, [{"n": i, "pad": "z" * 300} for i in range(40)])
    _flush_all(d, Keep(seconds=3600, max_bytes=1 << 30, min_free_bytes=1 << 62))
    assert len(list_segments(d)[0]) == 1


def test_rewind_reads_the_kept_records_again_from_a_position(tmp_path):
    """Rewound to the position after record 24, the reader yields records 25 to 39 again."""
    d = str(tmp_path)
    write(d, 0, [{"n": i, "pad": "z" * 300} for i in range(40)])
    records = _flush_all(d, HOUR)
    at = records[24]
    with OutboxReader.open(d, HOUR) as reader:
        assert drain(reader) == []
        assert reader.rewind({0: Position(at.segno, at.end, at.seq + 1)}) == {0: True}
        assert [v["n"] for v in values(drain(reader))] == list(range(25, 40))


def test_rewind_to_nothing_reads_every_kept_record(tmp_path):
    """A shard the database holds nothing of is read again from its start, whole while nothing of it went."""
    d = str(tmp_path)
    write(d, 0, [{"n": i} for i in range(10)])
    _flush_all(d, HOUR)
    with OutboxReader.open(d, HOUR) as reader:
        assert reader.rewind({0: None}) == {0: True}
        assert [v["n"] for v in values(drain(reader))] == list(range(10))


def test_rewind_past_the_kept_tail_says_so_and_reads_what_is_left(tmp_path):
    """A position in a segment already deleted: False, and reading starts at the oldest kept."""
    d = str(tmp_path)
    write(d, 0, [{"n": i, "pad": "z" * 300} for i in range(40)])
    segs = list_segments(d)[0]
    records = _flush_all(d, HOUR)
    os.unlink(os.path.join(d, segment_name(0, segs[0])))
    first = records[0]
    with OutboxReader.open(d, HOUR) as reader:
        assert reader.rewind({0: Position(first.segno, first.end, first.seq + 1)}) == {0: False}
        again = [v["n"] for v in values(drain(reader))]
    assert again == list(range(again[0], 40)) and again[0] > 1


def test_a_note_rides_with_the_checkpoint(tmp_path):
    """What the caller keeps with a checkpoint is there for the next reader."""
    d = str(tmp_path)
    write(d, 0, [1, 2, 3])
    with OutboxReader.open(d) as reader:
        assert reader.note == {}
        reader.mark_flushed(drain(reader))
        reader.checkpoint({"batch": 7})
    with OutboxReader.open(d) as reader:
        assert reader.note == {"batch": 7}
        reader.checkpoint()
    with OutboxReader.open(d) as reader:
        assert reader.note == {"batch": 7}
