"""One child process, from the parent's side: its process, its pipes, its progress slots.

``ChildHandle`` starts the child (with a large non-blocking pipe each way), queues frames
for it without ever blocking, reads what it reports, tracks which sent jobs it started
(one progress slot per job in flight, in the outbox directory's ``progress-<shard>.bin``:
``shardworker.child.progress``) and, after a death, hands over what it held, for
``shardworker.worker.deaths`` to sort by those slots and its shard.
Its life is one state (``Life``), changed only here (``_become``)::

    STARTING --(its app loaded: progress says up)--> UP --(request_stop)--> DRAINING
    DRAINING --(it says Stopped)--> STOPPED
    any started state --(its process ended, or was killed, and its jobs were settled: died)--> DEAD
    DEAD --(restart time: start)--> STARTING        DEAD --(retire)--> RETIRED, never restarted

A DEAD child restarts at ``restart_at`` (at once after a death a job caused, later after a
crash; never when the worker is stopping); RETIRED is one whose startup hook raised, or
whose crashes make a loop. While it lives, the pool may ``recall`` the jobs it was sent and
has not started (they come back to its ``held`` queue, for any child with room), and may
isolate a suspect: a job that was running at an unexplained death runs alone
(``send_suspect``). ``Pace`` keeps its recent rate of finished jobs. The pool of children
(``shardworker.worker.pool``) and its sender (``shardworker.worker.sending``) drive these
handles through their methods and read their state; they write none of their fields.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import fcntl
import logging
from collections import deque
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import Any

from shardworker.child.main import EXIT_START_FAILED, child_main
from shardworker.child.progress import Progress, ProgressFile
from shardworker.core import layout, logs, procs, wire
from shardworker.core.config import ChildConfig
from shardworker.core.jobstats import JobCounts
from shardworker.core.model import ClaimedJob
from shardworker.core.views import FlowCount
from shardworker.errors import StartupFailed

log = logging.getLogger(__name__)

_F_SETPIPE_SZ = 1031
PIPE_BYTES = 1 << 20  # the most an unprivileged process may ask for by default
ASYNC_TIMEOUT_GRACE_S = 10.0  # an async handler is cancelled in the child; this is the backstop


PACE_WINDOW_S = 0.25


class Life(enum.Enum):
    """Where a child is in its life (the module's docstring draws the transitions)."""

    STARTING = "starting"  # its process runs; its app is loading: jobs sent wait in its pipe
    UP = "up"  # it reads jobs
    DRAINING = "draining"  # asked to stop: it finishes the jobs in hand and starts no other
    STOPPED = "stopped"  # it said so, naming the jobs it never started; its process exits
    DEAD = "dead"  # its process ended and its jobs were settled; restarts at restart_at, if set
    RETIRED = "retired"  # dead for good: a startup hook raised, or its crashes make a loop


@dataclass
class Pace:
    """A child's recent rate of finished jobs: a moving average over windows of
    ``PACE_WINDOW_S``, decaying while it finishes nothing."""

    rate: float = 0.0
    window_start: float | None = None
    count: int = 0

    def finished(self, count: int, now: float) -> None:
        self.roll(now)
        self.count += count

    def roll(self, now: float) -> float:
        """The rate as of ``now`` (closing the window if it is over)."""
        if self.window_start is None:
            self.window_start = now
        elapsed = now - self.window_start
        if elapsed >= PACE_WINDOW_S:
            self.rate = 0.5 * self.rate + 0.5 * self.count / elapsed
            self.window_start, self.count = now, 0
        return self.rate


@dataclass
class Sent:
    job: ClaimedJob
    slot: int
    size: int
    at: float = 0.0  # when it was sent (the pool's clock)


@dataclass
class ChildHandle:
    """One child process, the jobs sent to it and not yet reported, and those waiting here."""

    config: ChildConfig
    process: Any = None
    out: wire.OutFrames | None = None
    inp: wire.InFrames | None = None
    progress: Progress | None = None
    sent: dict[wire.JobKey, Sent] = field(default_factory=dict)
    held: deque[ClaimedJob] = field(default_factory=deque)
    sent_bytes: int = 0
    pace: Pace = field(default_factory=Pace)
    life: Life = Life.DEAD  # never started yet: the pool starts it (changed only by _become)
    unstarted: tuple[wire.JobKey, ...] = ()  # what a STOPPED child never started
    recalling: bool = False  # a Recall is on its way: send nothing until its Returned
    saturated: bool = False  # recalled, and has finished nothing since: worth no more jobs
    returned: list[Sent] = field(default_factory=list)  # taken back (now held), for the pool's caps
    reported_at: float = 0.0  # when it last reported a finished job (the pool's clock)
    finished_here: int = 0  # jobs its current process reported finished (their handlers ran there)
    fatal: str = ""
    job_counts: JobCounts = field(default_factory=JobCounts)  # the pool's, for the metrics
    alive_until: Any = None  # the pool's shared gate (shardworker.child.gate.StartGate)
    restart_at: float | None = None  # a DEAD child's restart (the pool's clock); None: not scheduled
    # Claimed jobs that were running in an earlier death whose cause is unknown: each runs alone, in turn.
    suspects: deque[ClaimedJob] = field(default_factory=deque)
    suspect: wire.JobKey | None = None  # the suspect sent last
    crashes: procs.CrashCounter = field(init=False)
    _free: list[int] = field(default_factory=list)
    _pipes: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.crashes = procs.CrashCounter(f"child {self.index}")

    @property
    def index(self) -> int:
        return self.config.shard

    def _become(self, life: Life, restart_at: float | None = None) -> None:
        """The one place a child's life changes."""
        self.life, self.restart_at = life, restart_at

    @property
    def started(self) -> bool:
        """Its current process was started and has not been settled dead."""
        if self.life is Life.STARTING and self.progress is not None and self.progress.up:
            self._become(Life.UP)
        return self.life in (Life.STARTING, Life.UP, Life.DRAINING, Life.STOPPED)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    @property
    def ready(self) -> bool:
        """Started, alive, and not running suspects: jobs may be sent."""
        return self.started and self.alive and not self.isolating

    @property
    def up(self) -> bool:
        """Its app is loaded and it reads jobs: what it is sent can start at once."""
        return self.ready and self.life is Life.UP

    @property
    def loading(self) -> bool:
        """Alive, and its app still loading."""
        return self.started and self.life is Life.STARTING and self.alive

    @property
    def isolating(self) -> bool:
        """Suspects wait, or one runs alone: nothing else may be sent."""
        return bool(self.suspects) or self.suspect in self.sent

    @property
    def stopped(self) -> bool:
        return self.life is Life.STOPPED

    def due_for_restart(self, now: float) -> bool:
        return self.life is Life.DEAD and self.restart_at is not None and now >= self.restart_at

    def died(self, restart_at: float | None) -> None:
        """Its process ended (or was killed) and its jobs were settled; it restarts at
        ``restart_at`` (None: not now, the worker is stopping)."""
        self._become(Life.DEAD, restart_at)

    def retire(self) -> None:
        """Never restart it."""
        self._become(Life.RETIRED)

    def stopped_without_report(self) -> None:
        """Killed while stopping (its cancelled handler was past its grace): it reported no
        unstarted job; its jobs were settled as a death's."""
        self.unstarted = ()
        self._become(Life.STOPPED)

    def reported(self, count: int, now: float) -> None:
        """It reported ``count`` finished jobs at ``now``."""
        self.pace.finished(count, now)
        self.reported_at = now

    def take_returned(self) -> list[Sent]:
        """The recalled jobs it gave back since the last call (held again here)."""
        taken, self.returned = self.returned, []
        return taken

    def send_suspect(self, job: ClaimedJob) -> None:
        """Send ``job``, a suspect, to run alone."""
        self.suspect = (job.id, job.attempt)
        self.send_now([job], [job.size + 64])

    def keep_suspects_turn(self, unstarted: list[ClaimedJob]) -> list[ClaimedJob]:
        """After its death: the suspect it was sent and never started waits for its turn
        again; returns the other unstarted jobs."""
        if self.suspect is None:
            return unstarted
        suspect, self.suspect = self.suspect, None
        self.suspects.extendleft([j for j in unstarted if (j.id, j.attempt) == suspect])
        return [j for j in unstarted if (j.id, j.attempt) != suspect]

    def start(self, now: float, fork: bool = False) -> None:
        """Start the child process: spawned, or (``fork``, at the worker's start only) forked."""
        ctx = procs.context(fork)
        self._close_pipes()
        to_child_r, to_child_w = ctx.Pipe(duplex=False)
        from_child_r, from_child_w = ctx.Pipe(duplex=False)
        with contextlib.suppress(OSError):
            fcntl.fcntl(to_child_w.fileno(), _F_SETPIPE_SZ, PIPE_BYTES)
        # The slots a dead predecessor left stay until reused: its jobs' outcomes are the parent's to write.
        slots = ProgressFile(layout.progress_path(self.config.outbox_dir, self.index), self.config.slots)
        progress = slots.open()
        progress.mark_starting()
        args = (self.config, to_child_r, from_child_w, slots, logs.current(), self.alive_until)
        process = ctx.Process(target=child_main, args=args, name=f"shardworker-shard-{self.index}", daemon=True)
        self.process = process
        procs.start_process(process, fork)
        to_child_r.close()
        from_child_w.close()
        self._pipes = [to_child_w, from_child_r]
        self.attach(process, wire.OutFrames(to_child_w.fileno()), wire.InFrames(from_child_r.fileno()), progress, now)

    def attach(self, process: Any, out: wire.OutFrames, inp: wire.InFrames, progress: Progress,
               now: float = 0.0) -> None:
        """Take ``process`` (started: anything with ``is_alive``, ``pid`` and ``exitcode``) as this
        child, talking through ``out`` and ``inp``, its progress slots all free: it is STARTING.
        ``start`` attaches the process it starts; a test may attach a thread running a child."""
        self.process, self.out, self.inp = process, out, inp
        self.progress, self._free = progress, list(range(self.config.slots - 1, -1, -1))
        self.fatal, self.finished_here, self.unstarted = "", 0, ()
        self.recalling = self.saturated = False
        self._become(Life.STARTING)
        self.crashes.started(now)

    def _close_pipes(self) -> None:
        for pipe in self._pipes:
            pipe.close()
        self._pipes = []

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def send_now(self, jobs: list[ClaimedJob], sizes: list[int], now: float = 0.0) -> None:
        slots = []
        for job, size in zip(jobs, sizes, strict=True):
            slot = self._free.pop()
            assert self.progress is not None
            self.progress.clear(slot)
            self.sent[(job.id, job.attempt)] = Sent(job, slot, size, now)
            self.sent_bytes += size
            slots.append(slot)
        self.put(wire.Jobs(tuple(jobs), tuple(slots)))

    def put(self, msg: wire.Message) -> None:
        with contextlib.suppress(OSError):  # the child is gone: the death check deals with it
            assert self.out is not None
            self.out.put(msg)

    def flush(self) -> None:
        with contextlib.suppress(OSError):
            if self.out is not None:
                self.out.flush()

    def recall(self) -> None:
        """Ask for the jobs it has not started; they come back in ``receive`` (``Returned``)."""
        self.recalling = self.saturated = True
        self.put(wire.Recall())

    def waiting_since(self) -> tuple[float, bool] | None:
        """When the oldest sent job that has not started was sent, and whether a job sent
        before it has started (it waits behind running handlers); None when all started.

        Reads slots in send order up to the first unstarted job: about as many as run at once."""
        if self.progress is None:
            return None
        for position, sent in enumerate(self.sent.values()):
            if not self.progress.started(sent.slot, sent.job.id):
                return sent.at, position > 0
        return None

    def request_stop(self) -> None:
        if self.out is not None:
            self.put(wire.Stop())
            if self.started and self.life is not Life.STOPPED:
                self._become(Life.DRAINING)

    def receive(self) -> list[Sent]:
        """Read what the child reported; returns the jobs it finished."""
        finished: list[Sent] = []
        if self.inp is None:
            return finished
        try:
            messages = self.inp.read()
        except OSError:
            return finished
        for msg in messages:
            if isinstance(msg, wire.Done):
                for key in msg.finished:
                    finished.append(self._release(key))
                self.finished_here += len(msg.finished)
                if msg.stats:
                    self.job_counts.add(msg.stats)
                if not self.recalling:
                    self.saturated = False  # a handler finished since the recall: it can start another
            elif isinstance(msg, wire.Returned):
                taken = [self._release(key) for key in msg.jobs]
                # First in line again, here in the parent, for whichever child has room.
                self.held.extendleft(reversed([sent.job for sent in taken]))
                self.returned.extend(taken)
                # Saturated while it still runs something (its next report clears it); with nothing
                # left, nothing would, and it is free.
                self.recalling, self.saturated = False, bool(self.sent)
            elif isinstance(msg, wire.Stopped):
                self.unstarted = msg.unstarted
                self._become(Life.STOPPED)
            elif isinstance(msg, wire.Fatal):
                self.fatal = msg.message
                # A start that failed is said once, by the worker as it stops (the pool's StartupFailed).
                log.log(logging.DEBUG if msg.at_start else logging.ERROR, "child %d: %s", self.index, self.fatal)
        return finished

    def start_failed(self) -> StartupFailed | None:
        """After its death: when a startup hook raised (``EXIT_START_FAILED``), it is never
        restarted, and this is the ``StartupFailed`` that stops the worker; else None."""
        if self.process is None or self.process.exitcode != EXIT_START_FAILED:
            return None
        self.retire()
        return StartupFailed(f"child {self.index} could not start: {self.fatal or 'an on_startup hook raised'}")

    def _release(self, key: wire.JobKey) -> Sent:
        sent = self.sent.pop(key)
        self.sent_bytes -= sent.size
        self._free.append(sent.slot)
        return sent

    def running(self, kinds: Container[str] | None = None) -> Iterable[tuple[ClaimedJob, float]]:
        """(job, monotonic start) of every handler running now (of ``kinds`` only, when given)."""
        if self.progress is None:
            return
        for sent in self.sent.values():
            if kinds is not None and sent.job.kind not in kinds:
                continue
            since = self.progress.running_since(sent.slot, sent.job.id)
            if since is not None:
                yield sent.job, since

    def take_all(self) -> list[Sent]:
        """After the process died: take every job sent to it off it (its progress slots go
        with it); ``shardworker.worker.deaths`` sorts them."""
        sent = list(self.sent.values())
        for s in sent:
            self._release((s.job.id, s.job.attempt))
        self.progress = None
        return sent


def flow_counts(handles: Iterable[ChildHandle]) -> list[FlowCount]:
    """This worker's jobs by queue and kind, for the heartbeat's flow report: prefetched
    (held here, suspects waiting, sent and not started by its child) and running (started,
    not yet reported). Read from the heartbeat's thread: each queue is copied in one C call
    first, so the dispatcher's changes meanwhile cannot break the iteration."""
    counts: collections.Counter[tuple[str, str, bool]] = collections.Counter()
    for handle in list(handles):
        progress, sent = handle.progress, list(handle.sent.values())
        for job in (*list(handle.held), *list(handle.suspects)):
            counts[(job.queue, job.kind, False)] += 1
        for s in sent:
            counts[(s.job.queue, s.job.kind, progress is not None and progress.started(s.slot, s.job.id))] += 1
    names = sorted({(queue, kind) for queue, kind, _ in counts})
    return [FlowCount(q, k, counts[(q, k, False)], counts[(q, k, True)]) for q, k in names]
