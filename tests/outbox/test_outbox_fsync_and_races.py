"""An fsync EIO, and a flusher deleting segments while a writer recovers or ``verify``
reads them. Each checks exactly-once delivery of acknowledged records
(``tests.outbox.exactly_once``).
"""

import errno
import os

import outbox
from outbox import OutboxReader, OutboxSyncError, ShardWriter, inspect, recovery
from outbox.segment import list_segments, scan_file, segment_name
from tests.outbox.exactly_once import SMALL, Producer, drain, read_ids

# --- fsync EIO ------------------------------------------------------------------------------


def test_fdatasync_eio_abandons_the_segment_and_later_commits_are_read(tmp_path, monkeypatch):
    """EIO from fdatasync: OutboxSyncError, the batch is cut off, that segment is never
    written again, and later commits go to a new segment and are read."""
    d = str(tmp_path)
    w = ShardWriter.open(d, 0, SMALL)
    p = Producer(w)
    assert p.batch(3)
    bad = os.path.join(d, segment_name(0, w.segno))
    size = os.path.getsize(bad)
    failing = [OSError(errno.EIO, "Input/output error")]
    real = os.fdatasync

    def fdatasync_failing_once(fd: int) -> None:
        if failing:
            raise failing.pop()
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync_failing_once)
    segno = w.segno
    assert not p.batch(4)
    assert p.failures == [OutboxSyncError] and w.pending == 0
    assert os.path.getsize(bad) == size  # the unsynced batch is not left for recovery to seal
    assert p.batch(3) and p.batch(2)
    assert w.segno == segno + 1
    w.close()
    assert os.path.getsize(bad) == size
    assert scan_file(d, 0, segno + 1).sealed
    assert sorted(read_ids(d)) == sorted(p.acked)
    ShardWriter.open(d, 0).close()  # recovery seals the abandoned segment; nothing is read twice
    assert sorted(read_ids(d)) == sorted(p.acked)
    assert outbox.verify(d).corrupt == []


# --- a flusher and a restarting writer at the same time ------------------------------------


def test_writer_recovery_tolerates_the_flusher_deleting_segments_meanwhile(tmp_path, monkeypatch):
    """A flusher checkpoint that deletes finished segments while a restarting writer scans the
    shard does not make the writer fail to open."""
    d = str(tmp_path)
    with ShardWriter.open(d, 0, SMALL) as w:
        p = Producer(w)
        for _ in range(30):
            assert p.batch(3)
    assert len(list_segments(d)[0]) > 3
    reader = OutboxReader.open(d)
    reader.mark_flushed(drain(reader))
    real_read_file = recovery.read_file
    flusher = [reader]

    def read_file_racing_the_flusher(path: str) -> bytes:
        if flusher:  # the flusher's checkpoint runs between recovery's listing and its reads
            flusher.pop().checkpoint()
        return real_read_file(path)

    monkeypatch.setattr(recovery, "read_file", read_file_racing_the_flusher)
    with ShardWriter.open(d, 0, SMALL) as p.writer:
        assert p.batch(2)
    reader.close()
    assert sorted(read_ids(d)) == sorted(p.acked)[-2:]


def test_verify_tolerates_the_flusher_deleting_segments_meanwhile(tmp_path, monkeypatch):
    """verify() runs beside a live flusher: a segment deleted between its listing and its read
    is skipped, not an error."""
    d = str(tmp_path)
    with ShardWriter.open(d, 0, SMALL) as w:
        p = Producer(w)
        for _ in range(30):
            assert p.batch(3)
    reader = OutboxReader.open(d)
    reader.mark_flushed(drain(reader))
    newest = list_segments(d)[0][-1]
    real_read_file = inspect.read_file
    flusher = [reader]

    def read_file_racing_the_flusher(path: str) -> bytes:
        if flusher:
            flusher.pop().checkpoint()
        return real_read_file(path)

    monkeypatch.setattr(inspect, "read_file", read_file_racing_the_flusher)
    report = outbox.verify(d)
    reader.close()
    # The checkpoint also put an empty segment after the newest (its writer is gone): not listed yet.
    assert [s.path for s in report.segments] == [segment_name(0, n) for n in list_segments(d)[0] if n <= newest]
