"""Process plumbing shared by the parent, the children and the flusher process: how they
start, what they do first, how they die, and how often they may crash.

Spawned processes find shardworker's own code first: a project folder named ``outbox/``
or ``shardworker/`` in the working directory must not shadow the packages. ``start``
spawns with ``PYTHONSAFEPATH`` set (so the ``-c`` bootstrap does not put the working
directory first; removed again in the new process, so handlers' own subprocesses are
unaffected) and without the working directory in the inherited ``sys.path``; ``load_app``
appends it once shardworker is imported.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import multiprocess

from shardworker.core import logs
from shardworker.core.retry import Backoff
from shardworker.errors import CrashLoop

log = logging.getLogger(__name__)

T = TypeVar("T")
_PR_SET_PDEATHSIG = 1
_SAFE_PATH = "PYTHONSAFEPATH"


def context(fork: bool = False) -> Any:
    """The multiprocess context: spawn, so no psycopg connection ever crosses a fork; fork
    only for a worker's first children and flusher, started before the parent opens any
    connection or thread (``forked``): they start in milliseconds, sharing what the parent
    imported, instead of importing it all again."""
    return multiprocess.get_context("fork" if fork else "spawn")


_CLOSE_IN_FORKED: set[int] = set()  # descriptors of the parent a forked process must not keep


def close_in_forked(fd: int) -> None:
    """Have processes forked from now on close ``fd`` first (a lock only the parent may hold)."""
    _CLOSE_IN_FORKED.add(fd)


def start_process(process: Any, fork: bool) -> None:
    """Start ``process`` (made with ``context(fork)``)."""
    if fork:
        process.start()
    else:
        start(process)


def wait_ready(readable: list[int], writable: list[int], timeout_s: float) -> list[int]:
    """Wait up to ``timeout_s`` until one of ``readable`` can be read or ``writable`` written;
    returns the readable ones."""
    if not readable and not writable:
        time.sleep(timeout_s)
        return []
    ready, _, _ = select.select(readable, writable, [], timeout_s)
    return ready


def start(process: Any) -> None:
    """Start a spawned process that imports shardworker's own packages before anything in the
    working directory: its bootstrap gets no working directory on ``sys.path``, and neither
    does the ``sys.path`` it inherits (``load_app`` appends it there once shardworker is
    imported). An editable install finds its packages only after every ``sys.path`` entry,
    so even a directory at the end of the path would shadow them."""
    before, saved_path = os.environ.get(_SAFE_PATH), sys.path[:]
    here = {"", ".", os.getcwd(), getattr(multiprocess.process, "ORIGINAL_DIR", None)}
    # Run from a source checkout (not installed), the working directory holds shardworker
    # itself: keep it, or the new process could not import the package that spawned it.
    here.discard(str(Path(__file__).resolve().parent.parent))
    os.environ[_SAFE_PATH] = "1"
    sys.path[:] = [entry for entry in sys.path if entry not in here]
    try:
        process.start()
    finally:
        sys.path[:] = saved_path
        if before is None:
            os.environ.pop(_SAFE_PATH, None)
        else:
            os.environ[_SAFE_PATH] = before


def become_worker_process(parent_pid: int, role: str, log_setup: logs.LogSetup | None = None) -> None:
    """First steps of a child or the flusher: die with the parent, leave signals to it, log;
    a forked one lets go of the parent's locks."""
    for fd in _CLOSE_IN_FORKED:  # empty in a spawned process: its module was imported afresh
        with contextlib.suppress(OSError):
            os.close(fd)
    _CLOSE_IN_FORKED.clear()
    # A process must not outlive its parent: an orphan finishing a job after a restarted
    # worker requeued it would make that job run twice.
    die_with_parent()
    if os.getppid() != parent_pid:
        os._exit(1)  # the parent died before the death signal was armed
    if os.environ.get(_SAFE_PATH) == "1":
        del os.environ[_SAFE_PATH]  # set by ``start`` for the bootstrap only
    # The parent coordinates shutdown: a terminal's Ctrl-C must not kill children mid-job.
    ignore_stop_signals()
    signal.set_wakeup_fd(-1)  # a forked one's signals are not the parent's to be woken by
    name_process(f"sw-{role}")
    logs.configure(log_setup or logs.LogSetup(), role)


def signal_wakeup_pipe() -> tuple[int, int]:
    """A non-blocking pipe that each signal writes a byte to (``signal.set_wakeup_fd``): its
    read end turns readable when a signal comes, so a wait on it ends at once; (read, write)."""
    read, write = os.pipe()
    for fd in (read, write):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    return read, write


def close_signal_wakeup_pipe(read: int, write: int) -> None:
    """Stop signals writing to the pipe of ``signal_wakeup_pipe``, and close it."""
    signal.set_wakeup_fd(-1)
    os.close(read)
    os.close(write)


def name_process(name: str) -> None:
    """Show ``name`` for this process in ``ps -o comm``, ``top`` and ``/proc/PID/comm``."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "w", encoding="ascii", errors="replace") as f:
        f.write(name[:15])


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (a kill -9 included)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        log.debug("prctl unavailable; relying on pipe EOF to notice the parent's death")


def ignore_stop_signals() -> None:
    """The parent coordinates shutdown; Ctrl-C in a terminal reaches the whole group."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


_held_signals: list[int] = []  # stop signals that came before the supervisor's handlers (stop_signals_held)


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """Around ``shardworker run``, from its first line: until the supervisor installs its own
    handlers (``handle_stop_signals``; the app's import can take seconds), a SIGTERM or SIGINT is
    remembered, and the worker then stops before starting anything; a second one exits at once,
    as it does later. The handlers in place before are put back at the end (a run in-process)."""

    def remember(signum: int, _frame: Any) -> None:
        if _held_signals:
            os.write(2, b"second signal while starting: exiting now\n")
            os._exit(1)
        _held_signals.append(signum)

    previous = {signum: signal.signal(signum, remember) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _held_signals.clear()


def handle_stop_signals(handler: Callable[[int, Any], None]) -> None:
    """``handler`` for SIGTERM and SIGINT from now on; given at once a signal held since
    ``stop_signals_held`` began."""
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    if _held_signals:
        handler(_held_signals[0], None)


def boottime() -> float:
    """Seconds on a clock every process of the host shares that also runs while the host is
    suspended (CLOCK_BOOTTIME; monotonic where there is none), as peers' clocks do meanwhile."""
    return time.clock_gettime(_BOOTTIME) if _BOOTTIME is not None else time.monotonic()


_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


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


def sleep_until(deadline: float, should_stop: Callable[[], bool], step_s: float = 0.05) -> None:
    """Sleep until ``deadline`` (monotonic) or until ``should_stop()`` is true."""
    while time.monotonic() < deadline and not should_stop():
        time.sleep(min(step_s, max(0.0, deadline - time.monotonic())))


def wait_for_lock(open_fn: Callable[[], T], locked: type[BaseException], wait_s: float,
                  step_s: float = 0.05) -> T:
    """``open_fn()``, retried while it raises ``locked`` (a holder still exiting), up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return open_fn()
        except locked:
            if time.monotonic() >= deadline:
                raise
            time.sleep(step_s)


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``, for a report in one line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class CrashCounter:
    """Restart pacing for one process, and the verdict that it is crash-looping.

    A death within ``fast_s`` of starting counts toward ``limit``; a process that lived
    longer starts the count again. Restarts wait 0.1 s doubling to 5 s while it keeps
    dying fast.
    """

    def __init__(self, name: str, *, limit: int = 5, fast_s: float = 10.0) -> None:
        self.name, self.limit, self.fast_s = name, limit, fast_s
        self.fast_deaths = 0
        self._started_at = 0.0
        self._backoff = Backoff(0.1, 5.0)

    def started(self, now: float) -> None:
        self._started_at = now

    def died(self, now: float, last_error: str) -> float:
        """Seconds to wait before restarting; ``CrashLoop`` when it died fast too often."""
        if now - self._started_at >= self.fast_s:
            self.fast_deaths = 0
            self._backoff.reset()
            return 0.0
        self.fast_deaths += 1
        if self.fast_deaths >= self.limit:
            raise CrashLoop(f"{self.name} died {self.fast_deaths} times within {self.fast_s:g}s of starting; "
                            f"last error: {last_error}")
        return self._backoff.next_delay()
