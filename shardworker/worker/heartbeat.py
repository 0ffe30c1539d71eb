"""The heartbeat: tells the database this worker is alive, and runs the rescuer.

It beats on its own thread and its own connection, from before startup recovery until
after the last job is given back, so nothing the parent does (claiming, a slow send,
settling a dead child, a shutdown) can make a live worker look dead to a rescuer. After
each successful beat it lets the ``Rescuer`` look at everyone else's.

Its first beat takes the worker id's row over (``shardworker.worker.identity`` checked it was
free); later beats write only a row this process wrote. A row another (hostname, pid)
rewrote meanwhile means a second live worker under this id: the heartbeat stops, keeps
the error in ``conflict`` and calls ``on_conflict``, and the worker stops with it. So does a
beat that finds the row gone by a rescue (``WorkerRescued``: the rescue left a tombstone of
this process's row): a peer rescued this worker's jobs while it was silent (its host paused,
or cut off), and they run elsewhere now. A row gone with no tombstone was lost by the database
going back in time (a failover to a replica that lagged, a restore): the beat has written it
again, and the worker goes on. Each beat also says which server it reached (``server``), for
the worker to notice a new one (``shardworker.worker.reapply_watch``).

After each beat that found its row, it moves ``on_alive(until)`` on: until then, one
``--rescue-after`` after the beat began, no peer can have rescued this worker. Its children
start a job they hold only before that instant (``shardworker.child.lanes``); a host paused
or cut off for longer stops them starting any until a beat says whether it was rescued.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from shardworker.core import procs
from shardworker.core.retry import Backoff, Outage, is_retryable
from shardworker.core.views import Beat, FlowCount, Serving
from shardworker.errors import ShardworkerError, StoreError, WorkerRescued
from shardworker.worker.identity import in_use
from shardworker.worker.rescuer import Rescuer, RescueStore

log = logging.getLogger(__name__)

Load = tuple[int | None, int | None, Sequence[FlowCount] | None]  # None: not known


class HeartbeatStore(RescueStore, Protocol):
    def beat(self, worker_id: str, hostname: str, pid: int, running: int | None = None,
             pending: int | None = None, flow: Sequence[FlowCount] | None = None, *,
             take_over: bool = True, serves: Serving | None = None, started_at: object = None) -> Beat: ...
    def close(self) -> None: ...


class Heartbeat:
    """Call ``run_once(now)`` in a loop (``start`` runs that loop on a thread)."""

    def __init__(self, store: HeartbeatStore, worker_id: str, interval_s: float, rescue_after_s: float | None,
                 backoff: Backoff, *, rescue_grace_s: float = 0.0, clock: Callable[[], float] = time.monotonic,
                 load: Callable[[], Load] = lambda: (None, None, None),
                 on_conflict: Callable[[ShardworkerError], None] = lambda exc: None,
                 serves: Serving | None = None,
                 on_alive: Callable[[float, float], None] = lambda boot, wall: None,
                 release_slots_after_s: float | None = None) -> None:
        self.store, self.worker_id, self.interval_s = store, worker_id, interval_s
        self.rescue_after_s, self.on_alive = rescue_after_s, on_alive
        # What the row says this worker serves (None: nothing), for those who ask whether a
        # kind has a live worker (shardworker.store.serving).
        self.serves = serves
        # (jobs running, outcomes pending in the outbox), shown by `shardworker workers`, and the
        # flow report (prefetched and running by queue and kind), summed by `shardworker queues`
        self.load = load
        self.clock = clock
        # An unreachable database is told once for the whole worker (shardworker.worker.dbwatch).
        self.outage = Outage("heartbeat", log, backoff, floor_s=interval_s, clock=clock, ended=None,
                             started="heartbeat failed ({error}); retrying every {delay:.1f}s or so")
        # No rescuer when it only keeps a worker alive (``outbox drain`` beating for the owner).
        # A pause of this host counts as watched silence unless it is long enough to matter: a peer
        # paused with it beats within an interval of the resume, before the window is out.
        self.rescuer = None if rescue_after_s is None else Rescuer(
            store, worker_id, rescue_after_s, rescue_grace_s,
            max_gap_s=max(3 * interval_s, rescue_after_s - 2 * interval_s), release_after_s=release_slots_after_s)
        self.last_ok: float | None = None
        self._last_ok_boot = 0.0  # the boot-time clock at the last good beat's start
        self._alive_until = math.inf  # the children's gate, as the last good beat set it (boot-time clock)
        self._refusing = False
        self.on_conflict = on_conflict
        self.conflict: ShardworkerError | None = None  # another process took this id's row, or a peer rescued us
        self.server = ""  # which server the last good beat reached (server_identity); "" before one
        self._started_at: object = None  # our row's started_at, as the last beat read it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def released(self) -> tuple[str, ...]:
        """The workers whose slots this worker's claims no longer count (``Rescuer.released``)."""
        return self.rescuer.released if self.rescuer is not None else ()

    def run_once(self, now: float) -> float:
        """Beat, then rescue; returns the seconds until the next beat."""
        if self.conflict is not None:
            return self.interval_s
        began, began_wall = procs.boottime(), time.time()  # the gate's clocks (see child.gate.StartGate)
        try:
            beat = self.store.beat(self.worker_id, socket.gethostname(), os.getpid(), *self.load(),
                                   take_over=self.last_ok is None, serves=self.serves, started_at=self._started_at)
            if beat.holder is not None and self._from_the_past(beat):
                log.warning("this worker's heartbeat row names %s, a process of this host that is gone: the database "
                            "went back in time to before this worker started; the row is taken over", beat.holder)
                beat = self.store.beat(self.worker_id, socket.gethostname(), os.getpid(), *self.load(),
                                       take_over=True, serves=self.serves, started_at=self._started_at)
            if self._stop.is_set():
                return self.interval_s  # a beat that outlived stop(): the worker is done with its row
            if beat.holder is not None:
                self._lost_the_id(beat.holder)
                return self.interval_s
            if beat.inserted and self.last_ok is not None and (beat.rescued or beat.server == self.server):
                # A tombstone says a rescue removed this process's row; so does a row gone on the same
                # server (a release before tombstones rescued it): the database cannot have gone back.
                self._stopped_by(WorkerRescued(
                    f"a peer rescued the jobs of worker {self.worker_id!r} while it was silent (paused, or cut off, "
                    f"for {began - self._last_ok_boot:.0f}s): they run elsewhere now, and it starts none of those "
                    "it held"))
                return self.interval_s
            if beat.inserted and self.last_ok is not None:
                log.warning("this worker's heartbeat row was gone, and no rescue removed it: the database went back "
                            "in time (a failover or a restore); the row is written again")
            self._started_at, self.server = beat.started_at, beat.server
            self.last_ok, self._last_ok_boot, self._refusing = now, began, False
            if self.rescue_after_s is not None:
                self._alive_until = began + self.rescue_after_s
                self.on_alive(self._alive_until, began_wall + self.rescue_after_s)
            self.outage.recovered()
            if self.rescuer is not None:
                self.rescuer.run_once(now)
        except StoreError as exc:
            if not is_retryable(exc):
                return self._refused(exc)
            if self.rescuer is not None:
                self.rescuer.connection_lost()
            # Beat again before the children's gate would close (an interval ahead), backoff or not.
            return min(self.outage.failed(exc), max(0.05, self._alive_until - procs.boottime() - self.interval_s))
        return self.interval_s

    def _from_the_past(self, beat: Beat) -> bool:
        """Whether a row held by another process is one the database went back to: a new server
        since the last good beat, and that process, of this host, gone (an earlier run of this
        worker, restarted in the stretch the database lost)."""
        if self.last_ok is None or not beat.server or beat.server == self.server or beat.holder is None:
            return False
        host, pid = beat.holder
        if host != socket.gethostname() or pid <= 0 or pid == os.getpid():
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False  # alive, another user's
        return False

    def _refused(self, exc: StoreError) -> float:
        """The database refuses the beat for good (not an outage): say so at ERROR, once per
        streak, and beat again at the normal pace; backing off would not help."""
        if not self._refusing:
            self._refusing = True
            log.error("heartbeat refused by the database: %s; trying again every %.1fs", exc, self.interval_s)
        return self.interval_s

    def _lost_the_id(self, holder: tuple[str, int]) -> None:
        """Another live process beats under this id: stop beating (its row stays its own)."""
        self._stopped_by(in_use(self.worker_id, *holder))

    def _stopped_by(self, conflict: ShardworkerError) -> None:
        self.on_alive(0.0, 0.0)  # the children start nothing more
        self.conflict = conflict
        self._stop.set()
        self.on_conflict(conflict)

    def start(self) -> None:
        if self.rescue_after_s is not None:
            self.on_alive(0.0, 0.0)  # closed until the first beat says no peer rescued this worker
        self._thread = threading.Thread(target=self._loop, name="shardworker-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        delay = 0.0
        while not self._stop.wait(delay):
            delay = self.run_once(self.clock())

    def stop(self, wait_s: float = 5.0) -> None:
        """Stop beating and close the store; a beat stuck on a dead connection is left to
        its daemon thread (it ends with the process)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(wait_s)
            if self._thread.is_alive():
                return
        self.store.close()
