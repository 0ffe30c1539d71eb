"""A fault-injecting file layer for power-loss tests (the LevelDB ``fault_injection_test``
idea): ``FaultFS`` drops unsynced bytes and undoes unsynced directory entries at a power
cut. ``tests.outbox.workload`` drives writers and a reader on it until the cut."""


import contextlib
import errno
import itertools
import os
import random
import stat
import tempfile
from collections.abc import Callable

import pytest

# --- power loss: a fault-injecting file layer ------------------------------------------------


class Crash(BaseException):
    """The power went out. A BaseException, so no ``except OSError`` in the outbox catches it."""


class Died(BaseException):
    """The process was killed during a call: its fds close, the page cache survives."""


_REAL = {name: getattr(os, name) for name in ("open", "close", "write", "writev", "fdatasync", "fsync", "replace",
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

    def _writev(self, fd: int, buffers: list[bytes]) -> int:
        """A gathered write: one step, like a write of the joined bytes."""
        if not self._mine(fd):
            return _REAL["writev"](fd, buffers)
        return self._write(fd, b"".join(buffers))

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
