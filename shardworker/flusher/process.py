"""The flusher process, and the parent's handle on it.

``FlusherHandle`` starts the process, restarts it when it dies (with a backoff that does
not block the caller), asks it to stop, and reads what it shares: a small struct in
shared memory with named fields, each written by one side only (the flusher writes
``flushed``, ``idle`` and ``drained``; the parent writes ``stop``). ``flushed_total``
survives restarts: the handle adds up what exited flushers flushed.

``flusher_main`` is the process: it opens the outbox reader and its own database
connection, then runs ``Flusher.run_once`` until told to stop.
"""

from __future__ import annotations

import ctypes
import enum
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from outbox import Keep, OutboxLocked, OutboxReader, wake
from shardworker.core import binding, layout, logs, procs
from shardworker.core.config import FlusherConfig, StoreConfig
from shardworker.core.retry import Backoff, retry_call
from shardworker.errors import NewerRecord
from shardworker.flusher.journal import Journal
from shardworker.flusher.loop import BATCH_BUCKETS, Flusher, FlushStats
from shardworker.flusher.marks import Marks

if TYPE_CHECKING:
    from shardworker.store.pg_store import PgStore

EXIT_WRONG_DATABASE = 4  # the flusher's database is not the one its outbox belongs to
EXIT_NEWER_RECORD = 5  # the outbox holds a record a newer release wrote (errors.NewerRecord)
# What the parent raises when the flusher exits refusing its outbox: restarting it would not help.
REFUSALS: dict[int, type[Exception]] = {EXIT_WRONG_DATABASE: binding.WrongDatabase, EXIT_NEWER_RECORD: NewerRecord}
IDLE_WAIT_S = 1.0  # an idle flusher's longest wait between polls, when writers wake it
STEP_GATHER_S = 0.05  # how long step records alone are held while more gather (Flusher.gather_steps_s)

log = logging.getLogger(__name__)


class StopRequest(enum.IntEnum):
    NONE = 0
    WHEN_IDLE = 1  # finish what the outbox holds, then exit
    NOW = 2  # exit after the current batch, applied or not


COUNTERS = ("applied", "replayed", "stale", "missing", "deadlettered", "db_errors", "batch_sum", "followups",
            "regressions")


class SharedState(ctypes.Structure):
    """What the flusher process and the parent share (lock-free: one writer per field).
    ``COUNTERS``, ``batch_buckets`` and ``failing`` are the flusher's ``FlushStats``, for
    the metrics and the parent's view of the database."""

    _fields_ = [("flushed", ctypes.c_int64), ("idle", ctypes.c_bool), ("drained", ctypes.c_bool),
                ("stop", ctypes.c_int), ("last_error", ctypes.c_char * 512),
                *((name, ctypes.c_int64) for name in COUNTERS),
                ("batch_buckets", ctypes.c_int64 * (len(BATCH_BUCKETS) + 1)), ("failing", ctypes.c_char * 256),
                ("batch_started_at", ctypes.c_double),
                # A stop's handshake (FlusherHandle.stop): the parent counts stop_seq up; the flusher, after a
                # pass that found it idle, sets idle_seq to the stop_seq it read before that pass began.
                ("stop_seq", ctypes.c_int64), ("idle_seq", ctypes.c_int64),
                # The mark's check (FlusherHandle.check_mark): the parent counts check_seq up; the flusher,
                # once it checked the database's mark after that, sets checked_seq to it. reapplying: it
                # re-applies what the database lost (shardworker.flusher.marks), claims held meanwhile.
                ("check_seq", ctypes.c_int64), ("checked_seq", ctypes.c_int64), ("reapplying", ctypes.c_bool)]

    def publish(self, stats: FlushStats) -> None:
        """Copy the flusher's stats (the flusher's side; ``failing`` first, so the parent
        never sees new counts with an old state)."""
        self.failing = stats.failing.encode(errors="replace")[:255]
        self.batch_started_at = stats.batch_started_at
        for name in COUNTERS:
            setattr(self, name, getattr(stats, name))
        for i, count in enumerate(stats.batch_buckets):
            self.batch_buckets[i] = count
        self.flushed = stats.flushed

    def counters(self) -> dict[str, Any]:
        return {**{name: int(getattr(self, name)) for name in COUNTERS}, "batch_buckets": list(self.batch_buckets)}


def open_reader(directory: str, wait_s: float, keep: Keep | None = None) -> OutboxReader:
    """Open the outbox reader (keeping ``keep`` of the applied tail), waiting up to ``wait_s``
    while a previous flusher still exits."""
    return procs.wait_for_lock(lambda: OutboxReader.open(directory, keep), OutboxLocked, wait_s)


def marks_for(reader: OutboxReader, store: PgStore, config: FlusherConfig) -> Marks:
    """The mark of the reader's outbox, under its own id and the worker id it runs for, with
    the ids its follow-ups got noted for as long as the kept tail lasts."""
    return Marks(reader, store, layout.outbox_id(reader.directory), layout.read_worker_id(reader.directory),
                 Journal(reader.directory, config.reapply_window_s), followup_wait_s=config.rescue_grace_s)


class FlusherHandle:
    """The parent's side of the flusher process."""

    def __init__(self, outbox_dir: str, store_config: StoreConfig, config: FlusherConfig, idle_sleep_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.outbox_dir, self.store_config, self.config = outbox_dir, store_config, config
        self.idle_sleep_s, self.clock = idle_sleep_s, clock
        self.process: Any = None
        self.state: Any = None
        self._carried = 0  # flushed by flusher processes that have exited
        self._carried_counters: dict[str, Any] = {}  # their SharedState.counters(), summed
        self._carry_lock = threading.Lock()  # a scrape never sees a restart's counts twice
        self._restart_at: float | None = None
        self._crashes = procs.CrashCounter("the flusher")

    def start(self, fork: bool = False) -> None:
        """Start the flusher process: spawned, or (``fork``, at the worker's start only) forked."""
        ctx = procs.context(fork)
        if self.state is None:
            self.state = ctx.RawValue(SharedState)
        self.state.flushed, self.state.idle, self.state.drained, self.state.last_error = 0, False, False, b""
        self.process = ctx.Process(target=flusher_main, name="shardworker-flusher", daemon=True,
                                   args=(self.outbox_dir, self.store_config, self.config, self.state,
                                         self.idle_sleep_s, os.getpid(), logs.current()))
        procs.start_process(self.process, fork)
        self._crashes.started(self.clock())

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    @property
    def flushed_total(self) -> int:
        """Outcomes flushed by every flusher process of this worker so far."""
        return self._carried + int(self.state.flushed)

    @property
    def idle(self) -> bool:
        return self.alive and bool(self.state.idle)

    @property
    def drained(self) -> bool:
        """Whether the current flusher has once found the outbox empty."""
        return bool(self.state.drained)

    def check(self) -> None:
        """Restart a dead flusher, after a backoff when it keeps dying; ``CrashLoop`` when it
        died too often right after starting."""
        if self.alive:
            return
        now = self.clock()
        if self._restart_at is None:
            self._carried += int(self.state.flushed)
            with self._carry_lock:
                self._carried_counters = _add(self._carried_counters, self.state.counters())
                self.state.publish(FlushStats())
            error = self.state.last_error.decode(errors="replace") or f"exit code {self.process.exitcode}"
            refusal = REFUSALS.get(self.process.exitcode or 0)
            if refusal is not None:
                raise refusal(error)
            log.error("flusher exited (%s); restarting it", error)
            self._restart_at = now + self._crashes.died(now, error)
        if now >= self._restart_at:
            self._restart_at = None
            self.start()

    def stop(self, deadline: float) -> None:
        """Once nothing more can be written (the children have stopped), let the flusher apply
        what the outbox holds, until ``deadline``, then stop it.

        It stops once a pass that *began after this call* found nothing left and wrote the
        checkpoint (``stop_seq``, ``idle_seq``). An idle flag, or a count of what was
        acknowledged, is not enough: a pass that read a shard just before a child's last
        commit and ended just after the children stopped says idle, and the job whose
        outcome it missed stays running until the next start (tests/worker/test_worker.py
        caught it once in 30 runs under load).
        """
        self.state.stop_seq += 1
        asked = self.state.stop_seq
        self.state.stop = StopRequest.WHEN_IDLE
        wake.poke(self.outbox_dir)  # an idle flusher waits on its socket: let it see the stop
        while self.clock() < deadline and self.alive and self.state.idle_seq < asked:
            time.sleep(0.005)
            wake.poke(self.outbox_dir)
        self.state.stop = StopRequest.NOW
        wake.poke(self.outbox_dir)
        if self.process is not None:
            procs.join_or_kill(self.process, 10)

    def check_mark(self) -> int:
        """Ask the flusher to check, before its next pass, that the database still holds what
        this outbox applied (re-applying at once if not); ``mark_checked`` says when it has."""
        self.state.check_seq += 1
        wake.poke(self.outbox_dir)
        return int(self.state.check_seq)

    def mark_checked(self, asked: int) -> bool:
        """Whether the check ``asked`` (``check_mark``'s number) is done and nothing is being re-applied."""
        return self.alive and int(self.state.checked_seq) >= asked and not self.state.reapplying

    @property
    def reapplying(self) -> bool:
        return self.state is not None and bool(self.state.reapplying)

    def counters(self) -> dict[str, Any]:
        """The flusher's counters (``COUNTERS`` and ``batch_buckets``), summed over its restarts."""
        if self.state is None:
            return SharedState().counters()
        with self._carry_lock:
            return _add(self._carried_counters, self.state.counters())

    @property
    def batch_started_at(self) -> float:
        """When the last batch the current flusher applied began (``time.monotonic``, the
        same clock in every process); 0 before the first."""
        return float(self.state.batch_started_at) if self.state is not None else 0.0

    @property
    def failing(self) -> str:
        """Why the flusher's last try failed while the database fails it; "" when it works."""
        # Read on every dispatcher pass: one field, no syscall (a dead flusher's value is
        # cleared before its successor starts).
        raw = self.state.failing if self.state is not None else b""
        return raw.decode(errors="replace") if raw else ""

    def kill(self) -> None:
        if self.alive:
            procs.kill_quietly(self.process.pid)


def flusher_main(directory: str, store_config: StoreConfig, config: FlusherConfig, state: Any,
                 idle_sleep_s: float, parent_pid: int, log_setup: logs.LogSetup | None = None) -> None:
    """Entry point of the flusher process (spawned; opens its own connection)."""
    procs.become_worker_process(parent_pid, "flusher", log_setup)
    from shardworker.store.pg_store import PgStore  # here: the parent forks its children before importing it
    try:
        reader = open_reader(directory, wait_s=30.0, keep=config.keep())
    except Exception as exc:
        state.last_error = procs.one_line(exc).encode()[:511]
        raise
    store = PgStore(store_config)

    def sleep(seconds: float) -> None:
        # A backoff ends early for a stop, and for a check of the mark the worker waits on
        # before it claims (it reached the database again: so may this one).
        procs.sleep_until(time.monotonic() + seconds,
                          lambda: state.stop >= StopRequest.NOW or state.check_seq > state.checked_seq)

    try:
        retry_call(lambda: binding.bind(directory, store, embedded=config.embedded_db),
                   "checking which database the outbox belongs to",
                   backoff=Backoff(config.backoff_base_s, config.backoff_cap_s), log=log,
                   should_stop=lambda: state.stop >= StopRequest.NOW, sleep=sleep)
    except binding.WrongDatabase as exc:
        state.last_error = str(exc).encode()[:511]
        os._exit(EXIT_WRONG_DATABASE)
    flusher = Flusher(reader, store, config, sleep=sleep, report_outages=False, gather_steps_s=STEP_GATHER_S,
                      lazy_checkpoints=True, marks=marks_for(reader, store, config))
    try:
        _loop(flusher, state, idle_sleep_s)
    except NewerRecord as exc:
        state.last_error = str(exc).encode()[:511]
        os._exit(EXIT_NEWER_RECORD)
    except Exception as exc:
        state.last_error = procs.one_line(exc).encode()[:511]
        raise
    finally:
        store.close()
        reader.close()


def _loop(flusher: Flusher, state: Any, idle_sleep_s: float) -> None:
    while True:
        stop_seq = state.stop_seq  # before the pass: an idle pass answers the stops asked before it began
        check_seq = state.check_seq
        if check_seq > state.checked_seq:
            flusher.check_wanted = True
        flusher.gather = state.stop == StopRequest.NONE  # a stop applies held steps at once
        flushed = flusher.run_once()
        state.reapplying = flusher.reapplying
        if not flusher.check_wanted:
            state.checked_seq = max(state.checked_seq, check_seq)
        if flushed or not flusher.caught_up:  # a pass that found nothing changes no count
            state.publish(flusher.stats)
        # Idle for the parent: everything applied and checkpointed (an --exit-when-idle run
        # exits once the outbox holds nothing, its checkpoint the proof; see Flusher).
        state.idle = flusher.idle
        if flusher.idle:
            state.drained, state.idle_seq = True, stop_seq
        # WHEN_IDLE: every pass applies what it finds, at once; the parent says when it is
        # all (NOW, FlusherHandle.stop), and the checkpoint is written on the way out.
        if state.stop >= StopRequest.NOW:
            flusher.finish()
            return
        if flusher.gathering:
            time.sleep(idle_sleep_s)
        elif flusher.caught_up and state.check_seq <= state.checked_seq:
            # Until a writer commits (outbox.wake), a stop pokes or the checkpoint put off is
            # due; the timeout is a safety net for a wake-up lost (a directory too deep for a
            # socket: every idle_sleep_s).
            flusher.reader.wait(min(IDLE_WAIT_S if flusher.reader.waking else idle_sleep_s,
                                    flusher.checkpoint_due_in()))


def _add(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    if not a:
        return b
    return {key: [x + y for x, y in zip(a[key], value, strict=True)] if isinstance(value, list) else a[key] + value
            for key, value in b.items()}
