"""The child pool: the parent's side of its child processes.

It starts N children, sends them jobs, collects what they report, notices deaths and
handler timeouts, settles a dead child's jobs and restarts it (with a backoff that never
blocks the caller, and a ``CrashLoop`` verdict for a child that keeps dying at once). It
returns plain results and never touches the database: the dispatcher writes the
failures of lost jobs and counts what was settled.

What a child holds is bounded: at most ``max_jobs`` jobs and about ``max_bytes`` of
payload sent and not yet reported (one job over the byte budget goes alone), and, across
the pool, at most ``concurrency=K`` jobs of a kind that caps it. How many the dispatcher
claims for a child follows its pace (``target``): ``min_jobs``, plus what it finishes in
``horizon_s`` at its recent rate, up to ``max_jobs``; a child stuck on a slow handler soon
asks for no more than ``min_jobs``. Jobs routed to a child
beyond that wait here, in order, until it reports. Sends never block: frames queue on a
non-blocking pipe and go out as the child reads.

Each sent job gets a progress slot; the child marks it when the handler starts and when
it finishes. After a death, a started job whose outcome is durable in the child's shard
counts as finished, a started job without one was lost with the child, and the rest are
resent to its successor.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import outbox
from shardworker import procs, wire
from shardworker.app import HandlerSpec
from shardworker.model import ClaimedJob
from shardworker.shard import ChildConfig, Progress, child_main

log = logging.getLogger(__name__)

_F_SETPIPE_SZ = 1031
PIPE_BYTES = 1 << 20  # the most an unprivileged process may ask for by default
ASYNC_TIMEOUT_GRACE_S = 10.0  # an async handler is cancelled in the child; this is the backstop


@dataclass(frozen=True)
class Death:
    """What a dead child left: how many started jobs have a durable outcome, the started
    jobs without one, and the jobs it never started (resent once it is restarted)."""

    index: int
    reason: str
    durable: int
    lost: tuple[ClaimedJob, ...]
    unstarted: tuple[ClaimedJob, ...]


PACE_WINDOW_S = 0.25


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
class _Sent:
    job: ClaimedJob
    slot: int
    size: int


@dataclass
class ChildHandle:
    """One child process, the jobs sent to it and not yet reported, and those waiting here."""

    config: ChildConfig
    process: Any = None
    out: wire.OutFrames | None = None
    inp: wire.InFrames | None = None
    progress: Progress | None = None
    sent: dict[wire.JobKey, _Sent] = field(default_factory=dict)
    held: deque[ClaimedJob] = field(default_factory=deque)
    sent_bytes: int = 0
    pace: Pace = field(default_factory=Pace)
    stopped: bool = False
    unstarted: tuple[wire.JobKey, ...] = ()  # what a stopping child never started
    fatal: str = ""
    restart_at: float | None = None
    crashes: procs.CrashCounter = field(init=False)
    _free: list[int] = field(default_factory=list)
    _pipes: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.crashes = procs.CrashCounter(f"child {self.index}")

    @property
    def index(self) -> int:
        return self.config.shard

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    @property
    def ready(self) -> bool:
        """Alive and not waiting for a restart: jobs may be sent."""
        return self.restart_at is None and self.alive

    def start(self, now: float) -> None:
        ctx = procs.context()
        self._close_pipes()
        to_child_r, to_child_w = ctx.Pipe(duplex=False)
        from_child_r, from_child_w = ctx.Pipe(duplex=False)
        with contextlib.suppress(OSError):
            fcntl.fcntl(to_child_w.fileno(), _F_SETPIPE_SZ, PIPE_BYTES)
        array = ctx.Array("q", Progress.width(self.config.slots), lock=False)
        self.process = ctx.Process(target=child_main, args=(self.config, to_child_r, from_child_w, array),
                                   name=f"shardworker-shard-{self.index}", daemon=True)
        procs.start(self.process)
        to_child_r.close()
        from_child_w.close()
        self._pipes = [to_child_w, from_child_r]
        self.out, self.inp = wire.OutFrames(to_child_w.fileno()), wire.InFrames(from_child_r.fileno())
        self.progress, self._free = Progress(array, self.config.slots), list(range(self.config.slots - 1, -1, -1))
        self.stopped, self.fatal, self.restart_at = False, "", None
        self.crashes.started(now)

    def _close_pipes(self) -> None:
        for pipe in self._pipes:
            pipe.close()
        self._pipes = []

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def send_now(self, jobs: list[ClaimedJob], sizes: list[int]) -> None:
        slots = []
        for job, size in zip(jobs, sizes, strict=True):
            slot = self._free.pop()
            assert self.progress is not None
            self.progress.clear(slot)
            self.sent[(job.id, job.attempt)] = _Sent(job, slot, size)
            self.sent_bytes += size
            slots.append(slot)
        self._put(wire.Jobs(tuple(jobs), tuple(slots)))

    def _put(self, msg: wire.Message) -> None:
        with contextlib.suppress(OSError):  # the child is gone: the death check deals with it
            assert self.out is not None
            self.out.put(msg)

    def flush(self) -> None:
        with contextlib.suppress(OSError):
            if self.out is not None:
                self.out.flush()

    def request_stop(self) -> None:
        if self.out is not None:
            self._put(wire.Stop())

    def receive(self) -> list[_Sent]:
        """Read what the child reported; returns the jobs it finished."""
        finished: list[_Sent] = []
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
            elif isinstance(msg, wire.Stopped):
                self.stopped, self.unstarted = True, msg.unstarted
            elif isinstance(msg, wire.Fatal):
                self.fatal = msg.message
                log.error("child %d: %s", self.index, self.fatal)
        return finished

    def _release(self, key: wire.JobKey) -> _Sent:
        sent = self.sent.pop(key)
        self.sent_bytes -= sent.size
        self._free.append(sent.slot)
        return sent

    def running(self) -> Iterable[tuple[ClaimedJob, float]]:
        """(job, monotonic start) of every handler running now."""
        if self.progress is None:
            return
        for sent in self.sent.values():
            since = self.progress.running_since(sent.slot, sent.job.id)
            if since is not None:
                yield sent.job, since

    def settle(self, reason: str) -> tuple[Death, list[_Sent], list[_Sent]]:
        """After the process died: split its unreported jobs by what its shard holds.

        Returns the death, the jobs it reported before dying, and every other job taken off
        it (the started ones, and the unstarted ones now held for its successor)."""
        reported = self.receive()
        self.process.join(1)
        progress = self.progress
        sent = list(self.sent.values())
        started = [s for s in sent if progress is not None and progress.started(s.slot, s.job.id)]
        durable = _durable_keys(self.config.outbox_dir, self.index, len(started)) if started else set()
        lost = tuple(s.job for s in started if (s.job.id, s.job.attempt) not in durable)
        unstarted = [s.job for s in sent if s not in started]
        for s in sent:
            self._release((s.job.id, s.job.attempt))
        self.held.extendleft(reversed(unstarted))  # resent first, in their order, to the successor
        self.progress = None
        if lost:
            log.error("child %d %s; %d started jobs failed this attempt, %d acknowledged, %d not started",
                      self.index, reason, len(lost), len(started) - len(lost), len(unstarted))
        return Death(self.index, reason, len(started) - len(lost), lost, tuple(unstarted)), reported, sent


def _durable_keys(directory: str, shard: int, count: int) -> set[wire.JobKey]:
    """(id, attempt) of the outcomes among a dead child's last ``count`` records."""
    keys = set()
    for payload in outbox.tail_records(directory, shard, count):
        with contextlib.suppress(ValueError, TypeError):
            keys.add(wire.outcome_key(payload))
    return keys


class ChildPool:
    """The children of one worker."""

    def __init__(self, configs: Iterable[ChildConfig], specs: Mapping[str, HandlerSpec], *, max_jobs: int,
                 max_bytes: int, min_jobs: int | None = None, horizon_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.handles = [ChildHandle(config) for config in configs]
        self.specs, self.max_jobs, self.max_bytes, self.clock = specs, max_jobs, max_bytes, clock
        self.min_jobs, self.horizon_s = min(max_jobs, min_jobs or max_jobs), horizon_s
        self.limits = {kind: spec.concurrency for kind, spec in specs.items() if spec.concurrency}
        self.by_kind: collections.Counter[str] = collections.Counter()  # sent and unreported, per capped kind
        self._finished = 0

    def __len__(self) -> int:
        return len(self.handles)

    def start(self) -> None:
        for handle in self.handles:
            handle.start(self.clock())

    def outstanding(self, index: int) -> int:
        """Jobs routed to child ``index`` and not yet reported (sent, or waiting here)."""
        handle = self.handles[index]
        return len(handle.sent) + len(handle.held)

    def target(self, index: int) -> int:
        """Jobs worth holding for child ``index`` at its recent pace (see the module docstring)."""
        rate = self.handles[index].pace.roll(self.clock())
        return min(self.max_jobs, self.min_jobs + int(rate * self.horizon_s))

    @property
    def in_flight(self) -> int:
        return sum(len(h.sent) + len(h.held) for h in self.handles)

    def job_ids(self) -> list[int]:
        """Ids of every job routed to a child and not yet reported."""
        return [s.job.id for h in self.handles for s in h.sent.values()] + [j.id for h in self.handles for j in h.held]

    def held_bytes(self) -> int:
        """Payload bytes claimed and waiting here, not yet sent to a child."""
        return sum(len(j.payload_json) for h in self.handles for j in h.held)

    def send(self, index: int, jobs: list[ClaimedJob]) -> None:
        """Route jobs to child ``index``; what it has no room for waits here."""
        self.handles[index].held.extend(jobs)
        self._pump(self.handles[index])

    def _pump(self, handle: ChildHandle) -> None:
        """Send held jobs while the child has room and their kinds are under their caps."""
        if not handle.ready:
            return
        batch: list[ClaimedJob] = []
        sizes: list[int] = []
        skipped: list[ClaimedJob] = []
        jobs_left = min(self.max_jobs - len(handle.sent), handle.free_slots)
        bytes_left = self.max_bytes - handle.sent_bytes
        while handle.held and len(batch) < jobs_left:
            job = handle.held[0]
            limit = self.limits.get(job.kind)
            if limit is not None and self.by_kind[job.kind] >= limit:
                skipped.append(handle.held.popleft())  # its kind is at its cap: later jobs may go first
                continue
            size = len(job.payload_json) + 64
            if size > bytes_left and (handle.sent or batch):
                break  # over the byte budget; a job bigger than the budget goes alone
            batch.append(handle.held.popleft())
            sizes.append(size)
            bytes_left -= size
            if limit is not None:
                self.by_kind[job.kind] += 1
        handle.held.extendleft(reversed(skipped))
        if batch:
            handle.send_now(batch, sizes)

    def collect(self) -> int:
        """Jobs reported finished (their outcomes durable) since the last call."""
        now = self.clock()
        for handle in self.handles:
            handle.flush()
            finished = handle.receive()
            if finished:
                handle.pace.finished(len(finished), now)
            self._forget(finished)
        for handle in self.handles:
            self._pump(handle)
        finished, self._finished = self._finished, 0
        return finished

    def _forget(self, taken: list[_Sent], *, finished: bool = True) -> None:
        """Jobs taken off a child: their kind caps free up; ``finished`` ones count as done."""
        for sent in taken:
            if sent.job.kind in self.limits:
                self.by_kind[sent.job.kind] -= 1
        if finished:
            self._finished += len(taken)

    def wait_fds(self) -> tuple[list[int], list[int]]:
        """Descriptors to wait on: reports to read, and pipes with frames still to write."""
        ready = [h for h in self.handles if h.alive and h.inp is not None and h.out is not None]
        return [h.inp.fd for h in ready if h.inp], [h.out.fd for h in ready if h.out and h.out.queued_bytes]

    def check(self) -> list[Death]:
        """Settle dead and timed-out children, restart those whose backoff has passed.

        Raises ``CrashLoop`` when a child died too often right after starting.
        """
        deaths, now = [], self.clock()
        for handle in self.handles:
            if handle.restart_at is not None:
                if now >= handle.restart_at:
                    handle.start(now)
                    self._pump(handle)
                continue
            if handle.alive:
                timed_out = self._timed_out(handle, now)
                if timed_out is None:
                    continue
                procs.kill_quietly(handle.process.pid)
                deaths.append(self._settle(handle, timed_out))
                handle.restart_at = now  # the handler's fault, not the child's: no crash-loop count
                continue
            reason = handle.fatal or f"worker process died (exit code {handle.process.exitcode})"
            deaths.append(self._settle(handle, reason))
            handle.restart_at = now + handle.crashes.died(now, reason)
        return deaths

    def _settle(self, handle: ChildHandle, reason: str) -> Death:
        death, reported, released = handle.settle(reason)
        self._forget(reported)
        self._forget(released, finished=False)  # the dispatcher counts the death's own
        return death

    def _timed_out(self, handle: ChildHandle, now: float) -> str | None:
        for job, started in handle.running():
            spec = self.specs.get(job.kind)
            if spec is None or spec.timeout_s is None:
                continue
            allowed = spec.timeout_s + (ASYNC_TIMEOUT_GRACE_S if spec.is_async else 0.0)
            if now - started > allowed:
                log.error("job %d (%s) exceeded its %.1fs timeout; killing child %d", job.id, job.kind,
                          spec.timeout_s, handle.index)
                return f"timed out after {spec.timeout_s:g}s"
        return None

    def request_stop(self) -> None:
        for handle in self.handles:
            handle.request_stop()

    def finish(self, deadline: float, on_finished: Callable[[int], None]) -> tuple[list[Death], list[wire.JobKey]]:
        """After ``request_stop``: wait for children to stop (kill them at ``deadline``).

        Reports finished jobs through ``on_finished``; returns the deaths to settle and the
        (id, attempt) of jobs never started (sent and returned, or never sent).
        """
        unstarted: list[wire.JobKey] = []
        while self.clock() < deadline and any(h.alive and not h.stopped for h in self.handles):
            reads, writes = self.wait_fds()
            procs.wait_ready(reads, writes, 0.1)
            on_finished(self._collect_only())
        on_finished(self._collect_only())
        deaths: list[Death] = []
        for handle in self.handles:
            if handle.stopped:
                unstarted.extend(handle.unstarted)
                handle.process.join(5)
            elif handle.process is not None:
                # Out of time, or it died: settle what it held without restarting it.
                reason = "shutdown timeout" if handle.alive else (handle.fatal or "worker process died")
                if handle.alive:
                    procs.kill_quietly(handle.process.pid)
                    handle.process.join(5)
                death = self._settle(handle, reason)
                deaths.append(death)
                on_finished(self._finished)
                self._finished = 0
            unstarted.extend((j.id, j.attempt) for j in handle.held)
            handle.held.clear()
        return deaths, unstarted

    def _collect_only(self) -> int:
        """``collect`` without sending more (shutting down)."""
        now = self.clock()
        for handle in self.handles:
            handle.flush()
            finished = handle.receive()
            if finished:
                handle.pace.finished(len(finished), now)
            self._forget(finished)
        finished, self._finished = self._finished, 0
        return finished

    def kill_all(self) -> None:
        for handle in self.handles:
            if handle.alive:
                procs.kill_quietly(handle.process.pid)
