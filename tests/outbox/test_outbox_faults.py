"""Faults the outbox must survive besides power loss: kill -9 of a writer process, a full
disk, fsync EIO, a flusher deleting segments meanwhile, a second flusher or writer.
Each checks exactly-once delivery of acknowledged records (``tests.outbox.exactly_once``).
"""


import contextlib
import errno
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest

import outbox
from outbox import (
    OutboxError,
    OutboxFull,
    OutboxLocked,
    OutboxReader,
    OutboxSyncError,
    ShardWriter,
    WriterConfig,
    fsutil,
    inspect,
    recovery,
)
from outbox.segment import list_segments, scan_file, segment_name
from tests.outbox.exactly_once import PYTHONPATH, SMALL, assert_exactly_once, drain, read_ids

# --- kill -9 of a writer process -------------------------------------------------------------

CHILD_WRITER = """
import random, sys
from outbox import ShardWriter, WriterConfig
directory, base, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
w = ShardWriter.open(directory, 0, WriterConfig(segment_bytes=64 * 1024, reserve_bytes=0))
print("ready", flush=True)
n = base
while True:
    k = rng.randint(1, 40)
    print("attempt", n, n + k - 1, flush=True)
    for i in range(n, n + k):
        w.append({"id": i, "pad": "k" * rng.randint(0, 3000)})
    w.commit()
    print("ack", n, n + k - 1, flush=True)
    n += k
"""


def spawn(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": PYTHONPATH})


def ranges(lines: list[str], tag: str) -> set[int]:
    out: set[int] = set()
    for line in lines:
        parts = line.split()
        if line.endswith("\n") and len(parts) == 3 and parts[0] == tag:
            out.update(range(int(parts[1]), int(parts[2]) + 1))
    return out


def flush_once(reader: OutboxReader, max_records: int = 500) -> list[int]:
    """One flusher cycle: poll, 'commit' (return the ids), mark flushed, checkpoint."""
    records = reader.poll(max_records)
    reader.mark_flushed(records)
    reader.checkpoint()
    return [r.value()["id"] for r in records]  # type: ignore[index]


def test_kill_9_of_a_writer_loses_no_acknowledged_record(tmp_path):
    """Writers SIGKILLed at random instants while a flusher follows them, restarted each time:
    every acknowledged id is read exactly once, and nothing never attempted."""
    d, rng = str(tmp_path), random.Random(1234)
    attempted: set[int] = set()
    acked: set[int] = set()
    read: list[int] = []
    reader = OutboxReader.open(d)
    for round_ in range(15):
        child = spawn(CHILD_WRITER, d, str(round_ * 1_000_000), str(round_))
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        deadline = time.monotonic() + rng.uniform(0.0, 0.25)
        while time.monotonic() < deadline:
            if round_ % 2:  # the flusher reads the segment the writer is appending to
                read += flush_once(reader)
            else:
                time.sleep(0.002)
        child.send_signal(signal.SIGKILL)
        lines = child.stdout.readlines()
        child.wait()
        attempted |= ranges(lines, "attempt")
        acked |= ranges(lines, "ack")
        if round_ % 3 == 1:  # a flusher between rounds recovers the dead writer's shard itself
            read += flush_once(reader, 10**6)
        if round_ % 4 == 3:  # the flusher restarts too, from its checkpoint
            reader.close()
            reader = OutboxReader.open(d)
    assert len(acked) > 100, "the writer was killed before it acknowledged much: test proves little"
    ShardWriter.open(d, 0).close()  # the last restart: recovery of the last killed writer
    read += flush_once(reader, 10**6)
    reader.close()
    assert read_ids(d) == []  # everything was flushed and checkpointed: no replay
    assert_exactly_once(read, acked, attempted)
    assert outbox.verify(d).corrupt == []


# --- disk full on a small tmpfs --------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: os.PathLike[str]) -> Iterator[str]:
    """A 2 MiB tmpfs, mounted for the test and unmounted after it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = os.path.join(str(tmp_path), "mnt")
    os.mkdir(mnt)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", mnt],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", mnt], check=False)


def fill(path: str, leave_bytes: int) -> None:
    """Write zeros to ``path`` until its file system has about ``leave_bytes`` free."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while (free := shutil.disk_usage(os.path.dirname(path)).free) > leave_bytes:
            with contextlib.suppress(OSError):
                os.write(fd, bytes(min(free - leave_bytes, 1 << 20)))
    finally:
        os.close(fd)


class Producer:
    """Commits batches of ids to one writer and keeps the three sets."""

    def __init__(self, writer: ShardWriter) -> None:
        self.writer = writer
        self.attempted: set[int] = set()
        self.acked: set[int] = set()
        self.failures: list[type[OutboxError]] = []
        self._next = 0

    @property
    def fulls(self) -> int:
        return self.failures.count(OutboxFull)

    def batch(self, n: int, pad: int = 200) -> bool:
        """Append and commit ``n`` records; False if the commit raised OutboxFull or OutboxSyncError."""
        ids = range(self._next, self._next + n)
        self._next += n
        self.attempted.update(ids)
        for i in ids:
            self.writer.append({"id": i, "pad": "f" * pad})
        try:
            self.writer.commit()
        except (OutboxFull, OutboxSyncError) as exc:
            self.failures.append(type(exc))
            return False
        self.acked.update(ids)
        return True


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


# --- a second flusher -------------------------------------------------------------------------

CHILD_HOLDER = """
import sys
from outbox import OutboxReader, ShardWriter
directory, what = sys.argv[1], sys.argv[2]
held = OutboxReader.open(directory) if what == "flusher" else ShardWriter.open(directory, 5)
print("holding", flush=True)
sys.stdin.read()
held.close()
"""


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_second_flusher_in_another_process_is_refused(tmp_path, how):
    """While one process is the flusher, another's OutboxReader.open raises OutboxLocked; a
    clean exit or kill -9 of the holder frees the lock."""
    d = str(tmp_path)
    child = spawn(CHILD_HOLDER, d, "flusher")
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline() == "holding\n"
    with pytest.raises(OutboxLocked):
        OutboxReader.open(d)
    assert outbox.status(d).flusher_alive
    if how == "kill":
        child.kill()
    else:
        child.stdin.close()
    child.wait()
    OutboxReader.open(d).close()
    assert not outbox.status(d).flusher_alive


def test_a_second_writer_of_a_shard_in_another_process_is_refused(tmp_path):
    """A shard held by a writer in another process cannot be opened until that process dies."""
    d = str(tmp_path)
    child = spawn(CHILD_HOLDER, d, "writer")
    assert child.stdout is not None
    assert child.stdout.readline() == "holding\n"
    with pytest.raises(OutboxLocked):
        ShardWriter.open(d, 5)
    child.kill()
    child.wait()
    ShardWriter.open(d, 5).close()
    assert list_segments(d)[5] == [1, 2]
