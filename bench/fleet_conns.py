"""Which worker holds which PostgreSQL connection, for bench/fleet.py.

Every worker names itself ``shardworker`` in ``pg_stat_activity.application_name``, so the
name alone cannot tell 8 workers apart. The server is local: each backend's
``client_port`` is the local port of a TCP socket that one process of one worker's tree
holds. Linux's ``/proc`` gives each process's socket inodes and ``/proc/net/tcp`` each
inode's local port, so every connection is counted for the worker (and the process, by its
name: ``sw-flusher``, ``sw-shard-N``, the parent) that holds it.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from pathlib import Path

import psycopg


def descendants(root: int) -> list[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int(Path("/proc", entry, "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def socket_ports() -> dict[int, int]:
    """Socket inode -> local TCP port, for every TCP socket of this machine."""
    ports: dict[int, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                ports[int(fields[9])] = int(fields[1].rsplit(":", 1)[1], 16)
    return ports


def process_ports(pid: int, ports: dict[int, int]) -> list[int]:
    """The local TCP ports of the sockets process ``pid`` holds."""
    found = []
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:[") and int(target[8:-1]) in ports:
                    found.append(ports[int(target[8:-1])])
    return found


def process_name(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/comm").read_text().strip()
    return "?"


def connections_by_worker(conn: psycopg.Connection, roots: list[int]) -> list[Counter[str]]:
    """For each worker (the pid of its parent process), its connections to the server now,
    counted by the name of the process holding each."""
    rows = conn.execute("SELECT client_port FROM pg_stat_activity "
                        "WHERE application_name = 'shardworker' AND client_port IS NOT NULL").fetchall()
    backend_ports = {int(port) for (port,) in rows}
    ports = socket_ports()
    counts: list[Counter[str]] = []
    for root in roots:
        held: Counter[str] = Counter()
        for pid in descendants(root):
            mine = [p for p in process_ports(pid, ports) if p in backend_ports]
            if mine:
                held["parent" if pid == root else process_name(pid)] += len(mine)
        counts.append(held)
    return counts
