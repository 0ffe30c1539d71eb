"""Waking the reader when a writer commits, instead of the reader polling the directory.

The reader binds a Unix datagram socket, ``wake.sock`` in the outbox directory (``0600`` in
the ``0700`` directory), and waits on it between polls (``Listener.wait``). After every
commit a writer sends it one empty datagram (``Poker.poke``): a non-blocking ``sendto`` that
never fails the commit. Nobody listening (no reader, or one that has not bound yet), or a
full socket queue (the reader has wake-ups pending anyway), is simply no wake-up: the reader
still polls on a timeout, so a lost datagram delays a record, never loses it.

A directory whose socket path does not fit ``sun_path`` (about 100 bytes) gets no socket:
its reader polls as before.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import time

WAKE_SOCKET = "wake.sock"
_MAX_PATH = 100  # sun_path holds 108 bytes on Linux, 104 on the BSDs


class Poker:
    """A writer's side: ``poke`` after each commit."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, WAKE_SOCKET)
        self._sock: socket.socket | None = None

    def poke(self) -> None:
        """Wake the reader if one listens; never raises."""
        if len(self.path) > _MAX_PATH:
            return
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sock.setblocking(False)
            self._sock.sendto(b"", self.path)
        except OSError:
            pass  # nobody listens, or its queue is full: it polls, or wakes anyway

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def poke(directory: str) -> None:
    """One wake-up for the reader of ``directory`` (a process that does not write: a stop)."""
    poker = Poker(directory)
    poker.poke()
    poker.close()


class Listener:
    """The reader's side: bound while the reader holds the directory's flusher lock (so the
    socket file a previous reader left is its own to replace)."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, WAKE_SOCKET)
        self._sock: socket.socket | None = None
        if len(self.path) > _MAX_PATH:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            try:
                sock.bind(self.path)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                os.unlink(self.path)  # a previous reader's socket file
                sock.bind(self.path)
            os.chmod(self.path, 0o600)
            sock.setblocking(False)
        except OSError:
            sock.close()
            return  # a read-only or odd filesystem: poll
        self._sock = sock

    @property
    def listening(self) -> bool:
        return self._sock is not None

    def wait(self, timeout_s: float) -> bool:
        """Until a writer pokes or ``timeout_s`` passes; True when poked. Every pending
        wake-up is taken: one poll after this sees all the commits that sent them."""
        if self._sock is None:
            time.sleep(timeout_s)
            return False
        ready, _, _ = select.select([self._sock], [], [], max(0.0, timeout_s))
        if not ready:
            return False
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while True:
                self._sock.recv(1)
        return True

    def close(self) -> None:
        """Stop listening. The socket file stays (a poke to it is refused, and ignored); the
        next reader replaces it. Closing touches no file: it runs after a crash too."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
