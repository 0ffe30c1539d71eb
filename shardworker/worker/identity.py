"""One worker id, one live worker.

Two live workers under one id would take each other's running jobs for their own (each
start requeues "its" running jobs), so they would run them twice. Before a worker, or
``outbox drain``, heartbeats or requeues orphans under an id, ``check_worker_id`` looks
at that id's heartbeat row:

* no row: the id is free;
* a row from this host whose pid is not alive: a crashed predecessor, taken over at once;
* otherwise the row is watched for ``WATCH_BEATS`` heartbeat intervals: a heartbeat that
  advanced means another live worker holds the id (``WorkerIdInUse``); a silent row is
  taken over (a host gone, an outbox copied from a dead host).

Two processes starting at the same moment can both pass; the heartbeat closes that race:
after its first beat, a process writes only a row it wrote itself, and one rewritten by
another (hostname, pid) stops it with the same error (``shardworker.worker.heartbeat``).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from shardworker.errors import WorkerIdInUse

log = logging.getLogger(__name__)

# 2.5 intervals: a live worker beats at least twice in that time, even one beat late.
WATCH_BEATS = 2.5


class IdentityStore(Protocol):
    def worker_row(self, worker_id: str) -> tuple[str, int, datetime] | None: ...


def in_use(worker_id: str, hostname: str, pid: int) -> WorkerIdInUse:
    return WorkerIdInUse(f"worker id {worker_id!r} is in use by a live worker on {hostname} (pid {pid}); "
                         "give each worker its own --worker-id")


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (perhaps another user's)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """A process that exited and was not reaped yet still answers kill(pid, 0); Linux's
    /proc says it is a zombie ("Z"). Elsewhere, or on any doubt: not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # The command name (field 2) is in parentheses and may hold spaces: the state follows the last ")".
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] == b"Z"


def check_worker_id(store: IdentityStore, worker_id: str, interval_s: float, *,
                    should_stop: Callable[[], bool] = lambda: False, sleep: Callable[[float], None] = time.sleep,
                    clock: Callable[[], float] = time.monotonic) -> None:
    """Return when this process may use ``worker_id``; raise ``WorkerIdInUse`` when another
    live process holds it. Waits at most ``WATCH_BEATS * interval_s`` (or until ``should_stop``)."""
    row = store.worker_row(worker_id)
    if row is None:
        return
    hostname, pid, _ = row
    if hostname == socket.gethostname() and (pid == os.getpid() or not pid_alive(pid)):
        return
    watch_s = WATCH_BEATS * interval_s
    log.info("worker id %r has a heartbeat row from %s (pid %d): watching it for %.1fs to see whether that "
             "worker is alive", worker_id, hostname, pid, watch_s)
    deadline = clock() + watch_s
    while not should_stop() and clock() < deadline:
        sleep(min(interval_s / 4, max(0.0, deadline - clock())))
        now = store.worker_row(worker_id)
        if now is None:
            return  # its worker stopped and removed its row
        if now != row:
            raise in_use(worker_id, now[0], now[1])
    if not should_stop():
        log.info("the heartbeat row of worker id %r stayed silent for %.1fs: taking the id over", worker_id, watch_s)
