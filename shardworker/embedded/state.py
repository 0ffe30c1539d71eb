"""The embedded server's run directory as files and processes: whether a server runs (its
``postmaster.pid`` and the process behind it), which local ports are free, writing a JSON
state file durably, and the tail of the server's log."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from outbox import atomic_write

_LOG_TAIL_LINES = 20


def read_pid_file(datadir: Path) -> tuple[int, int] | None:
    """(postmaster pid, port) from postmaster.pid, or None when absent or half-written."""
    try:
        lines = (datadir / "postmaster.pid").read_text().splitlines()
        return int(lines[0]), int(lines[3])
    except (OSError, ValueError, IndexError):
        return None


def is_postgres_process(pid: int) -> bool:
    """Alive, not a zombie (pid 1 may never reap it), and a postgres binary (pids get reused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by another user
    proc = Path(f"/proc/{pid}")
    if not proc.exists():
        return True  # no procfs: trust the signal
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        argv0 = (proc / "cmdline").read_bytes().split(b"\0", 1)[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X") and b"postgres" in argv0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as postgres does: TIME_WAIT is free
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def write_json(path: Path, value: object) -> None:
    """Durably replace ``path`` with ``value`` as JSON (the outbox's recipe, 0600)."""
    atomic_write(str(path.parent), path.name, json.dumps(value).encode())


def tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(cannot read: {exc})"
