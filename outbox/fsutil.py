"""File-system helpers: directory fsync, atomic state files, locks, free space."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil

DIR_MODE = 0o700
FILE_MODE = 0o600


def fsync_dir(directory: str) -> None:
    """Make entries created, renamed or deleted in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_dir(directory: str) -> None:
    """Create ``directory`` (0700) if missing, durably; tighten its mode if too open."""
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=DIR_MODE, exist_ok=True)
        fsync_dir(os.path.dirname(os.path.abspath(directory)))
    if os.stat(directory).st_mode & 0o077:
        os.chmod(directory, DIR_MODE)


def atomic_write(directory: str, name: str, data: bytes) -> None:
    """Durably replace ``name``: write tmp, fsync, rename, fsync the directory."""
    path = os.path.join(directory, name)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            if written == 0:
                raise OSError(errno.ENOSPC, "short write", tmp)
            view = view[written:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(directory)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def try_lock(path: str, *, shared: bool = False) -> int | None:
    """Open ``path`` and take a non-blocking flock; the fd, or None if held elsewhere."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def is_locked(path: str) -> bool:
    """Whether another process holds an exclusive flock on ``path`` (a brief probe)."""
    if not os.path.exists(path):
        return False
    fd = try_lock(path, shared=True)
    if fd is None:
        return True
    os.close(fd)
    return False


def free_bytes(directory: str) -> int:
    """Bytes available to unprivileged writers on ``directory``'s file system."""
    return shutil.disk_usage(directory).free
