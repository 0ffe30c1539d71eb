"""Process plumbing shared by the parent, the children and the flusher process."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import time
from typing import Any

import multiprocess

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def context() -> Any:
    """The multiprocess context: spawn, so no psycopg connection ever crosses a fork."""
    return multiprocess.get_context("spawn")


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (a kill -9 included).

    A worker killed as a whole must not leave children holding outbox locks; their
    acknowledged outcomes are on disk already, and unfinished jobs run again anyway.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        log.debug("prctl unavailable; relying on pipe EOF to notice the parent's death")


def ignore_stop_signals() -> None:
    """The parent coordinates shutdown; Ctrl-C in a terminal reaches the whole group."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def kill_quietly(pid: int | None) -> None:
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def join_or_kill(process: Any, timeout_s: float) -> None:
    """Wait for ``process`` up to ``timeout_s``, then SIGKILL it."""
    process.join(timeout_s)
    if process.is_alive():
        kill_quietly(process.pid)
        process.join(5)


def sleep_until(deadline: float, should_stop: Any, step_s: float = 0.05) -> None:
    """Sleep until ``deadline`` (monotonic) or until ``should_stop()`` is true."""
    while time.monotonic() < deadline and not should_stop():
        time.sleep(min(step_s, max(0.0, deadline - time.monotonic())))
