"""File-system helpers: directory fsync, the writer's gathered write, atomic state files,
locks, free space, and the trust check every outbox directory passes before anything in it
is read or written.

Every file is opened with ``O_NOFOLLOW``: a symlink planted in place of an outbox file is an
error (ELOOP), never a way to make the writer or reader touch a file elsewhere.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pwd
import shutil
import stat

from outbox.errors import OutboxUntrusted

DIR_MODE = 0o700
FILE_MODE = 0o600
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def fsync_dir(directory: str) -> None:
    """Make entries created, renamed or deleted in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_dir(directory: str) -> os.stat_result:
    """Refuse (``OutboxUntrusted``) a ``directory`` that is a symlink, not a directory, or
    not owned by this process's effective user; its ``lstat`` otherwise.

    Another user who owns the directory (or a symlink's target) can plant files in it:
    forged outcomes the flusher would apply, or symlinks that redirect our writes.
    """
    st = os.lstat(directory)
    if stat.S_ISLNK(st.st_mode):
        raise OutboxUntrusted(f"the outbox directory {directory} is a symlink (to {os.readlink(directory)}): "
                              "refusing it; point --outbox-dir at the real directory")
    if not stat.S_ISDIR(st.st_mode):
        raise OutboxUntrusted(f"the outbox path {directory} is not a directory")
    if st.st_uid != os.geteuid():
        raise OutboxUntrusted(f"the outbox directory {directory} is owned by {_user(st.st_uid)}, not by this "
                              f"process's user {_user(os.geteuid())}: refusing it (another user could plant "
                              "outcomes in it); move it aside and let the worker create its own")
    return st


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def ensure_dir(directory: str) -> None:
    """Create ``directory`` (0700) if missing, durably; refuse it if it is not ours
    (``check_dir``) or if other users could write to it (group or world writable: they may
    have planted files in it already); make it private (0700) if others could only read it."""
    created = False
    try:
        os.mkdir(directory, DIR_MODE)
        created = True
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(directory, mode=DIR_MODE, exist_ok=True)
        created = True
    if created:
        fsync_dir(os.path.dirname(os.path.abspath(directory)))
    st = check_dir(directory)
    if st.st_mode & 0o022:
        mode = stat.S_IMODE(st.st_mode)
        raise OutboxUntrusted(f"the outbox directory {directory} is writable by other users (mode {mode:04o}): "
                              "another account may have planted files in it; check what it holds, then "
                              f"`chmod 700 {directory}`, or move it aside and let the worker create its own")
    if st.st_mode & 0o077:
        # An fd on the checked directory: a rename between check and chmod cannot redirect it.
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW)
        try:
            os.fchmod(fd, DIR_MODE)
        finally:
            os.close(fd)


def check_contents(directory: str) -> None:
    """Refuse (``OutboxUntrusted``, naming it) a file or folder in ``directory``, or in its
    folders, that another account owns: it may be a forged outcome planted while the directory
    was open to others, and the reader would apply it."""
    me = os.geteuid()
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(root, name)
            try:
                owner = os.lstat(path).st_uid
            except FileNotFoundError:
                continue  # removed meanwhile (a flusher deleting an applied segment)
            if owner != me:
                raise OutboxUntrusted(f"{path} in the outbox is owned by {_user(owner)}, not by this process's "
                                      f"user {_user(me)}: refusing the outbox (it may be a forged outcome); "
                                      "check it and remove it, or move the directory aside")


def read_small(path: str) -> bytes:
    """The whole of a small state file, not following a symlink (``FileNotFoundError`` if absent)."""
    fd = os.open(path, os.O_RDONLY | NOFOLLOW)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes, path: str) -> None:
    """Write all of ``data`` to ``fd``; a write that takes nothing is a full disk (ENOSPC)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written == 0:
            raise OSError(errno.ENOSPC, "short write", path)
        view = view[written:]


_IOV_MAX = 1024  # Linux's limit on buffers per writev


def write_all_once(fd: int, parts: list[bytes]) -> int:
    """Write ``parts`` in order with one ``writev`` per ``_IOV_MAX`` buffers; the bytes
    written, stopping at the first short write (the caller treats it as a full disk)."""
    written = 0
    for start in range(0, len(parts), _IOV_MAX):
        chunk = parts[start:start + _IOV_MAX]
        n = os.writev(fd, chunk)
        written += n
        if n != sum(len(p) for p in chunk):
            break
    return written


def append_durably(path: str, data: bytes) -> None:
    """Append ``data`` to ``path`` (created 0600, never through a symlink) and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW, FILE_MODE)
    try:
        _write_all(fd, data, path)
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(directory: str, name: str, data: bytes) -> None:
    """Durably replace ``name``: write tmp, fsync, rename, fsync the directory. The tmp is
    this process's own (``name.PID.tmp``): two processes writing the same file at once (a
    worker and its flusher binding the outbox) each rename a whole file, the last one wins."""
    path = os.path.join(directory, name)
    tmp = f"{path}.{os.getpid()}.tmp"
    # A stale tmp (a crash mid-write) or a planted symlink goes first; O_EXCL then creates a
    # fresh file and never follows or reuses whatever sits at that name.
    _unlink_quietly(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, FILE_MODE)
    try:
        _write_all(fd, data, tmp)
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
    fd = os.open(path, os.O_RDWR | os.O_CREAT | NOFOLLOW, FILE_MODE)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def is_locked(path: str) -> bool:
    """Whether another process holds an exclusive flock on ``path`` (a brief probe)."""
    if not os.path.lexists(path):
        return False
    fd = try_lock(path, shared=True)
    if fd is None:
        return True
    os.close(fd)
    return False


def free_bytes(directory: str) -> int:
    """Bytes available to unprivileged writers on ``directory``'s file system."""
    return shutil.disk_usage(directory).free
