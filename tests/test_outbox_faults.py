"""Faults the outbox must survive: power loss, kill -9, a full disk, fsync EIO, a second flusher.

Every test counts three sets of record ids: *attempted* (appended), *acknowledged* (commit
returned) and *read* (yielded by a reader). It holds when every acknowledged id is read
exactly once and nothing read was never attempted.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator

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

SMALL = WriterConfig(segment_bytes=4096, reserve_bytes=0)
PYTHONPATH = os.path.dirname(os.path.dirname(outbox.__file__))


def drain(reader: OutboxReader) -> list[outbox.Record]:
    out: list[outbox.Record] = []
    while chunk := reader.poll(50):
        out.extend(chunk)
    return out


def read_ids(directory: str) -> list[int]:
    """Ids of every record a fresh reader yields (nothing marked flushed)."""
    with OutboxReader.open(directory) as reader:
        return [r.value()["id"] for r in drain(reader)]  # type: ignore[index]


def assert_exactly_once(read: list[int], acked: set[int], attempted: set[int]) -> None:
    assert len(read) == len(set(read)), "a record was read twice"
    assert acked <= set(read), f"acknowledged but lost: {sorted(acked - set(read))[:10]}"
    assert set(read) <= attempted, f"read but never attempted: {sorted(set(read) - attempted)[:10]}"


# --- power loss: a fault-injecting file layer ------------------------------------------------


class Crash(BaseException):
    """The power went out. A BaseException, so no ``except OSError`` in the outbox catches it."""


class Died(BaseException):
    """The process was killed during a call: its fds close, the page cache survives."""


_REAL = {name: getattr(os, name) for name in ("open", "close", "write", "fdatasync", "fsync", "replace",
                                              "unlink", "ftruncate")}


class FaultFS:
    """Tracks what is durable under ``root`` and can drop everything that is not.

    Durable state is what a power cut keeps: a file's content as of its last fsync or
    fdatasync, and a directory's entries as of its last fsync. Every wrapped call under
    ``root`` counts as one step; at step ``crash_at`` the call raises ``Crash`` instead of
    running, and so does every later call. At a step in ``die_at`` the call raises ``Died``
    instead (a write first lands a random prefix of its bytes, as kill -9 can leave it).

    The n-th fsync or fdatasync of a file, for n in ``eio_at``, fails with EIO the way Linux
    fails it: the unsynced pages stay readable in the page cache but never reach the disk,
    and a later fsync that succeeds does not write them ("fsyncgate"). Only bytes written
    again after the error become durable.
    """

    def __init__(self, root: str, rng: random.Random, crash_at: int, die_at: frozenset[int] = frozenset(),
                 eio_at: frozenset[int] = frozenset()) -> None:
        self.root, self.rng, self.crash_at = os.path.realpath(root), rng, crash_at
        self.die_at, self.eio_at = die_at, eio_at
        self.steps = self.file_syncs = 0
        self.crashed = False
        self._ids = itertools.count(1)
        self.paths: dict[int, str] = {}  # fd -> the path it was opened with
        self.ids: dict[tuple[int, int], int] = {}  # live (st_dev, st_ino) -> file id
        self.content: dict[int, bytes] = {}  # file id -> durable bytes
        self.lost: dict[int, list[tuple[int, int]]] = {}  # file id -> byte ranges EIO dropped
        self.dirs: dict[str, dict[str, int]] = {}  # directory -> durable entries (name -> file id)
        for directory, _, _ in os.walk(self.root):
            self._sync_dir(directory)
            for name, fid in self.dirs[directory].items():
                with open(os.path.join(directory, name), "rb") as f:
                    self.content[fid] = f.read()

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in _REAL:
            monkeypatch.setattr(os, name, getattr(self, "_" + name))

    def _mine(self, path: str | int, kw: dict[str, object] | None = None) -> bool:
        if isinstance(path, int):
            return path in self.paths
        return not kw and os.path.abspath(path).startswith(self.root + os.sep)

    def _step(self, torn_write: tuple[int, bytes] | None = None) -> None:
        self.steps += 1
        if self.crashed or self.steps >= self.crash_at:
            self.crashed = True
            raise Crash
        if self.steps in self.die_at:
            if torn_write:
                fd, data = torn_write
                _REAL["write"](fd, data[: self.rng.randint(0, len(data))])
            raise Died

    def _id(self, st: os.stat_result) -> int:
        key = (st.st_dev, st.st_ino)
        if key not in self.ids:
            self.ids[key] = next(self._ids)
        return self.ids[key]

    def _forget(self, path: str) -> None:
        """``path`` is about to lose its name: its inode number may be reused."""
        with contextlib.suppress(FileNotFoundError):
            st = os.stat(path)
            if st.st_nlink <= 1:
                self.ids.pop((st.st_dev, st.st_ino), None)

    def _sync_dir(self, directory: str) -> None:
        self.dirs[directory] = {e.name: self._id(e.stat()) for e in os.scandir(directory)
                                if e.is_file(follow_symlinks=False)}

    # The wrapped calls: one step each, then the real call, then the bookkeeping.

    def _open(self, path: str, flags: int, mode: int = 0o777, **kw: object) -> int:
        if not self._mine(path, kw) and os.path.abspath(path) != self.root:
            return _REAL["open"](path, flags, mode, **kw)
        self._step()
        fd = _REAL["open"](path, flags, mode)
        self.paths[fd] = os.path.abspath(path)
        return fd

    def _close(self, fd: int) -> None:
        self.paths.pop(fd, None)
        _REAL["close"](fd)

    def _write(self, fd: int, data: bytes) -> int:
        if not self._mine(fd):
            return _REAL["write"](fd, data)
        self._step(torn_write=(fd, data))
        offset = os.lseek(fd, 0, os.SEEK_CUR)
        written = _REAL["write"](fd, data)
        self._clip_lost(fd, lambda a, b: [(a, min(b, offset)), (max(a, offset + written), b)])
        return written

    def _ftruncate(self, fd: int, length: int) -> None:
        if self._mine(fd):
            self._step()
            self._clip_lost(fd, lambda a, b: [(a, min(b, length))])
        _REAL["ftruncate"](fd, length)

    def _clip_lost(self, fd: int, clip: Callable[[int, int], list[tuple[int, int]]]) -> None:
        fid = self._id(os.fstat(fd))
        if fid in self.lost:
            self.lost[fid] = [(a, b) for old in self.lost[fid] for a, b in clip(*old) if a < b]

    def _fdatasync(self, fd: int) -> None:
        self._sync("fdatasync", fd)

    def _fsync(self, fd: int) -> None:
        self._sync("fsync", fd)

    def _sync(self, name: str, fd: int) -> None:
        if not self._mine(fd):
            _REAL[name](fd)
            return
        self._step()
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            _REAL[name](fd)
            self._sync_dir(self.paths[fd])
            return
        fid = self._id(st)
        self.file_syncs += 1
        if self.file_syncs in self.eio_at:
            self.lost.setdefault(fid, []).append((len(self.content.get(fid, b"")), st.st_size))
            raise OSError(errno.EIO, "Input/output error (injected)")
        _REAL[name](fd)
        with open(f"/proc/self/fd/{fd}", "rb") as f:  # the fd may be write-only
            data = bytearray(f.read())
        for a, b in self.lost.get(fid, []):
            data[a:b] = bytes(len(data[a:b]))  # never written back: zeros on disk
        self.content[fid] = bytes(data)

    def _replace(self, src: str, dst: str, **kw: object) -> None:
        if self._mine(dst, kw):
            self._step()
            self._forget(dst)
        _REAL["replace"](src, dst, **kw)

    def _unlink(self, path: str, **kw: object) -> None:
        if self._mine(path, kw):
            self._step()
            self._forget(path)
        _REAL["unlink"](path, **kw)

    def power_loss(self) -> None:
        """Put every file back to its durable state, keeping a random torn part of unsynced appends.

        Call it after uninstalling, with every outbox fd closed.
        """
        self.crashed = True
        for directory, _, files in os.walk(self.root):
            durable = self.dirs.get(directory, {})
            for name in files:
                if name not in durable:  # created or renamed here without a directory fsync
                    _REAL["unlink"](os.path.join(directory, name))
            for name, fid in durable.items():
                self._restore(os.path.join(directory, name), fid)

    def _restore(self, path: str, fid: int) -> None:
        keep = self.content.get(fid, b"")
        try:
            with open(path, "rb") as f:
                now, same = f.read(), self._id(os.fstat(f.fileno())) == fid
        except FileNotFoundError:
            now, same = b"", False
        if same and len(now) > len(keep) and now.startswith(keep) and self.rng.random() < 0.6:
            keep = now[: self.rng.randint(len(keep), len(now))]  # part of the last unsynced write
            if self.rng.random() < 0.3:
                keep += bytes(self.rng.randint(1, 64))  # the size landed, the data did not
        with open(path, "wb") as f:
            f.write(keep)


def scratch_dir() -> tempfile.TemporaryDirectory[str]:
    """A directory on tmpfs when there is one: the fault layer, not the disk, decides durability."""
    return tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)


def kill(writer: ShardWriter) -> None:
    """What kill -9 leaves of a writer: its fds closed, no seal, no cleanup."""
    for fd in (writer._fd, writer._lock_fd):
        if fd is not None:
            os.close(fd)


class Workload:
    """Random appends, commits, writer restarts and flusher checkpoints on two shards.

    A ``Died`` from the file layer kills the whole worker (writers and flusher) and starts a
    new one, which recovers; so does an I/O error (an fsync EIO: exit, and let the restart
    recover, as the durability rules allow). A ``Crash`` ends the run.
    """

    def __init__(self, directory: str, rng: random.Random) -> None:
        self.directory, self.rng = directory, rng
        self.attempted: set[int] = set()
        self.acked: set[int] = set()
        self.checkpointed: set[int] = set()  # flushed, and a checkpoint() after it returned
        self.maybe_checkpointed: set[int] = set()  # flushed, in a checkpoint() that was cut short
        self.writers: dict[int, ShardWriter] = {}
        self.reader: OutboxReader | None = None
        self._next = 0

    def run(self, steps: int) -> None:
        self._start()
        for _ in range(steps):
            try:
                self._one_step()
            except (Died, OSError, OutboxError) as exc:
                self._die(exc)
                self._start()

    def _start(self) -> None:
        while True:
            try:
                for shard in (0, 1):
                    if shard not in self.writers:
                        self.writers[shard] = ShardWriter.open(self.directory, shard, SMALL)
                if self.reader is None:
                    self.reader = OutboxReader.open(self.directory)
                return
            except (Died, OSError, OutboxError) as exc:
                self._die(exc)

    def _die(self, exc: BaseException) -> None:
        """The worker dies of a kill or an injected EIO; any other error is a bug and propagates."""
        eio = isinstance(exc, OutboxSyncError) or (isinstance(exc, OSError) and exc.errno == errno.EIO)
        if not (eio or isinstance(exc, Died)):
            raise exc
        self._kill_all()

    def _kill_all(self) -> None:
        for w in self.writers.values():
            kill(w)
        self.writers = {}
        if self.reader is not None:
            self.reader.close()  # closes fds only
            self.reader = None

    def _one_step(self) -> None:
        roll, shard = self.rng.random(), self.rng.choice((0, 1))
        if roll < 0.65:
            self._commit(shard, self.rng.randint(1, 12))
        elif roll < 0.85:
            self._flush()
        else:
            self.writers.pop(shard).close()
            self.writers[shard] = ShardWriter.open(self.directory, shard, SMALL)

    def _commit(self, shard: int, n: int) -> None:
        ids = list(range(self._next, self._next + n))
        self._next += n
        self.attempted.update(ids)
        for i in ids:
            self.writers[shard].append({"id": i, "pad": "p" * self.rng.randint(0, 300)})
        self.writers[shard].commit()
        self.acked.update(ids)

    def _flush(self) -> None:
        assert self.reader is not None
        records = drain(self.reader)
        done = records[: self.rng.randint(0, len(records))]
        self.reader.mark_flushed(done)
        ids = {r.value()["id"] for r in done}  # type: ignore[index]
        self.maybe_checkpointed |= ids
        self.reader.checkpoint()
        self.checkpointed |= ids
        self.maybe_checkpointed -= ids
        # What was polled but not marked stays in flight; a new reader would replay it, so
        # drop this reader's memory of it by reopening.
        self.reader.close()
        self.reader = None
        self.reader = OutboxReader.open(self.directory)

    def abandon(self) -> None:
        """After the power cut: close every fd, running no outbox code that writes."""
        for w in self.writers.values():
            kill(w)
        if self.reader is not None:
            self.reader.close()


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
    real_read_file = inspect.read_file
    flusher = [reader]

    def read_file_racing_the_flusher(path: str) -> bytes:
        if flusher:
            flusher.pop().checkpoint()
        return real_read_file(path)

    monkeypatch.setattr(inspect, "read_file", read_file_racing_the_flusher)
    report = outbox.verify(d)
    reader.close()
    assert [s.path for s in report.segments] == [segment_name(0, n) for n in list_segments(d)[0]]


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
