"""The child pool: the parent's side of its child processes.

It starts N children, sends them jobs, collects what they report, notices deaths and
handler timeouts, settles a dead child's jobs and restarts it, with a backoff that never
blocks the caller and a crash-loop verdict (``CrashLoop``) for a child that keeps dying
at once. It returns plain results and never touches the database: the dispatcher writes
the failures of lost jobs and counts what was settled.

A child runs its jobs in the order they were sent, so after a death the parent knows
which unreported jobs were started (the first ``progress.started - reported``) and which
never were. A started job whose outcome is durable in the child's shard counts as
finished; a started job without one was lost with the child.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import outbox
from shardworker import procs, wire
from shardworker.model import ClaimedJob
from shardworker.shard import ChildConfig, Progress, child_main

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Death:
    """What a dead child left: how many started jobs have a durable outcome, the started
    jobs without one, and the jobs it never started (resent once it is restarted)."""

    index: int
    reason: str
    durable: int
    lost: tuple[ClaimedJob, ...]
    unstarted: tuple[ClaimedJob, ...]


@dataclass
class ChildHandle:
    """One child process and the jobs sent to it and not yet reported, in send order."""

    config: ChildConfig
    process: Any = None
    conn: Any = None
    progress: Progress | None = None
    sent: dict[wire.JobKey, ClaimedJob] = field(default_factory=dict)
    reported: int = 0  # jobs reported since this process started
    stopped: bool = False
    unstarted: tuple[wire.JobKey, ...] = ()  # what a stopping child never started
    fatal: str = ""
    restart_at: float | None = None
    crashes: procs.CrashCounter = field(init=False)

    def __post_init__(self) -> None:
        self.crashes = procs.CrashCounter(f"child {self.index}")

    @property
    def index(self) -> int:
        return self.config.shard

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def start(self, now: float) -> None:
        ctx = procs.context()
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        array = ctx.Array("q", Progress.WIDTH, lock=False)
        self.process = ctx.Process(target=child_main, args=(self.config, child_conn, array),
                                   name=f"shardworker-shard-{self.index}", daemon=True)
        procs.start(self.process)
        child_conn.close()
        self.conn, self.progress, self.reported = parent_conn, Progress(array), 0
        self.stopped, self.fatal, self.restart_at = False, "", None
        self.crashes.started(now)
        self._send(list(self.sent.values()))  # jobs a dead predecessor never started

    def send(self, jobs: list[ClaimedJob]) -> None:
        """Send jobs; to a dead child they wait and go to its successor."""
        for job in jobs:
            self.sent[(job.id, job.attempt)] = job
        if self.alive and self.restart_at is None:
            self._send(jobs)

    def _send(self, jobs: list[ClaimedJob]) -> None:
        if jobs:
            with contextlib.suppress(OSError, EOFError):  # dead: the death check resends them
                self.conn.send_bytes(wire.encode(wire.Jobs(tuple(jobs))))

    def request_stop(self) -> None:
        with contextlib.suppress(OSError, EOFError, AttributeError):
            self.conn.send_bytes(wire.encode(wire.Stop()))

    def collect(self) -> int:
        """Read every pending message; returns how many jobs were reported finished."""
        finished = 0
        try:
            while self.conn.poll(0):
                finished += self._handle(wire.decode(self.conn.recv_bytes()))
        except (EOFError, OSError):
            pass  # the child is gone; the death check deals with it
        return finished

    def _handle(self, msg: wire.Message) -> int:
        if isinstance(msg, wire.Done):
            for key in msg.finished:
                del self.sent[key]
            self.reported += len(msg.finished)
            return len(msg.finished)
        if isinstance(msg, wire.Stopped):
            self.stopped, self.unstarted = True, msg.unstarted
        elif isinstance(msg, wire.Fatal):
            self.fatal = msg.message
            log.error("child %d: %s", self.index, self.fatal)
        return 0

    def current_job(self) -> tuple[ClaimedJob, float] | None:
        """The job the child runs now and when it started (monotonic seconds)."""
        if self.progress is None or not (job_id := self.progress.job_id):
            return None
        position = self.progress.started - self.reported - 1
        jobs = list(self.sent.values())
        if 0 <= position < len(jobs) and jobs[position].id == job_id:
            return jobs[position], self.progress.started_at
        return None

    def settle(self, reason: str) -> Death:
        """After the process died: split its unreported jobs by what its shard holds."""
        self.collect()  # messages it wrote before dying
        self.process.join(1)
        jobs = list(self.sent.values())
        started_count = max(0, min(len(jobs), (self.progress.started if self.progress else 0) - self.reported))
        started, unstarted = jobs[:started_count], jobs[started_count:]
        durable = _durable_keys(self.config.outbox_dir, self.index, len(started)) if started else set()
        lost = tuple(j for j in started if (j.id, j.attempt) not in durable)
        for job in started:
            del self.sent[(job.id, job.attempt)]
        self.progress = None  # what is left in ``sent`` was never started
        if lost:
            log.error("child %d %s; %d started jobs failed this attempt, %d acknowledged, %d not started",
                      self.index, reason, len(lost), len(started) - len(lost), len(unstarted))
        return Death(self.index, reason, len(started) - len(lost), lost, tuple(unstarted))


def _durable_keys(directory: str, shard: int, count: int) -> set[wire.JobKey]:
    """(id, attempt) of the outcomes among a dead child's last ``count`` records."""
    keys = set()
    for payload in outbox.tail_records(directory, shard, count):
        with contextlib.suppress(ValueError, TypeError):
            outcome = wire.decode_outcome(payload)
            keys.add((outcome.job_id, outcome.attempt))
    return keys


class ChildPool:
    """The children of one worker."""

    def __init__(self, configs: Iterable[ChildConfig], timeouts: Mapping[str, float | None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.handles = [ChildHandle(config) for config in configs]
        self.timeouts, self.clock = timeouts, clock

    def __len__(self) -> int:
        return len(self.handles)

    def start(self) -> None:
        for handle in self.handles:
            handle.start(self.clock())

    def outstanding(self, index: int) -> int:
        """Jobs sent to child ``index`` and not yet reported (or settled)."""
        return len(self.handles[index].sent)

    @property
    def in_flight(self) -> int:
        return sum(len(h.sent) for h in self.handles)

    def send(self, index: int, jobs: list[ClaimedJob]) -> None:
        self.handles[index].send(jobs)

    def collect(self) -> int:
        """Jobs reported finished (their outcomes durable) since the last call."""
        return sum(h.collect() for h in self.handles)

    def connections(self) -> list[Any]:
        """Pipes to wait on for reports."""
        return [h.conn for h in self.handles if h.alive]

    def check(self) -> list[Death]:
        """Settle dead and timed-out children, restart those whose backoff has passed.

        Raises ``CrashLoop`` when a child died too often right after starting.
        """
        deaths, now = [], self.clock()
        for handle in self.handles:
            if handle.restart_at is not None:
                if now >= handle.restart_at:
                    handle.start(now)
                continue
            if handle.alive:
                timed_out = self._timed_out(handle, now)
                if timed_out is None:
                    continue
                procs.kill_quietly(handle.process.pid)
                deaths.append(handle.settle(timed_out))
                handle.restart_at = now  # the handler's fault, not the child's: no crash-loop count
                continue
            reason = handle.fatal or f"worker process died (exit code {handle.process.exitcode})"
            deaths.append(handle.settle(reason))
            handle.restart_at = now + handle.crashes.died(now, reason)
        return deaths

    def _timed_out(self, handle: ChildHandle, now: float) -> str | None:
        current = handle.current_job()
        if current is None:
            return None
        job, started = current
        timeout = self.timeouts.get(job.kind)
        if timeout is None or now - started <= timeout:
            return None
        log.error("job %d (%s) exceeded its %.1fs timeout; killing child %d", job.id, job.kind, timeout,
                  handle.index)
        return f"timed out after {timeout:g}s"

    def request_stop(self) -> None:
        for handle in self.handles:
            handle.request_stop()

    def finish(self, deadline: float, on_finished: Callable[[int], None]) -> tuple[list[Death], list[wire.JobKey]]:
        """After ``request_stop``: wait for children to stop (kill them at ``deadline``).

        Reports finished jobs through ``on_finished``; returns the deaths to settle and the
        (id, attempt) of jobs never started.
        """
        deaths: list[Death] = []
        unstarted: list[wire.JobKey] = []
        for handle in self.handles:
            while not handle.stopped and handle.alive and self.clock() < deadline:
                procs.wait_ready([handle.conn], 0.1)
                on_finished(self.collect())
            on_finished(self.collect())
            if handle.stopped:
                unstarted.extend(handle.unstarted)
                handle.process.join(5)
                continue
            # Out of time, or it died: settle what it held without restarting it.
            reason = "shutdown timeout" if handle.alive else (handle.fatal or "worker process died")
            if handle.alive:
                procs.kill_quietly(handle.process.pid)
                handle.process.join(5)
            if handle.process is not None:
                death = handle.settle(reason)
                deaths.append(death)
                unstarted.extend((j.id, j.attempt) for j in death.unstarted)
        return deaths, unstarted

    def kill_all(self) -> None:
        for handle in self.handles:
            if handle.alive:
                procs.kill_quietly(handle.process.pid)
