"""Parent-side bookkeeping for child processes: start, send, collect, recover after death.

Each child has a ``ChildHandle``: its process, pipe, shared slot and the jobs sent to it
and not yet reported, in send order. A child processes jobs in that order, so after a
death the parent knows which unreported jobs were started (the first
``started - reported``) and which never were.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson

from outbox.segment import list_segments, parse, read_file, segment_name
from shardworker import procs
from shardworker.model import ClaimedJob, Outcome
from shardworker.shard import (
    SLOT_JOB,
    SLOT_STARTED_COUNT,
    SLOT_STARTED_MS,
    SLOT_WIDTH,
    ChildConfig,
    child_main,
)

log = logging.getLogger(__name__)


@dataclass
class ChildHandle:
    index: int
    config: ChildConfig
    process: Any = None
    conn: Any = None
    slot: Any = None
    sent: deque[ClaimedJob] = field(default_factory=deque)
    reported: int = 0
    started_at: float = 0.0
    restarts: int = 0
    stopped: bool = False
    unstarted: list[tuple[int, int]] = field(default_factory=list)
    fatal: str = ""

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def start(self) -> None:
        ctx = procs.context()
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        self.slot = ctx.Array("q", SLOT_WIDTH, lock=False)
        self.process = ctx.Process(target=child_main, args=(self.config, child_conn, self.slot),
                                   name=f"shardworker-shard-{self.index}", daemon=True)
        self.process.start()
        child_conn.close()
        self.conn, self.reported, self.started_at = parent_conn, 0, time.monotonic()
        self.stopped, self.fatal = False, ""

    def send(self, jobs: list[ClaimedJob]) -> None:
        if not jobs:
            return
        self.conn.send_bytes(orjson.dumps(["jobs", [[j.id, j.kind, j.queue, j.payload_json, j.attempt,
                                                       j.max_attempts] for j in jobs]]))
        self.sent.extend(jobs)

    def request_stop(self) -> None:
        with contextlib.suppress(OSError, EOFError):
            self.conn.send_bytes(orjson.dumps(["stop"]))

    def collect(self) -> list[ClaimedJob]:
        """Read every pending message; returns the jobs reported done."""
        done: list[ClaimedJob] = []
        try:
            while self.conn.poll(0):
                done.extend(self._handle(orjson.loads(self.conn.recv_bytes())))
        except (EOFError, OSError):
            pass  # the child is gone; the death check deals with it
        return done

    def _handle(self, msg: list[Any]) -> list[ClaimedJob]:
        if msg[0] == "done":
            done = [self.sent.popleft() for _ in msg[1]]
            self.reported += len(done)
            return done
        if msg[0] == "stopped":
            self.stopped = True
            self.unstarted = [(int(i), int(a)) for i, a in msg[1]]
        elif msg[0] == "fatal":
            self.fatal = str(msg[1])
            log.error("child %d: %s", self.index, self.fatal)
        return []

    def current_job(self) -> tuple[ClaimedJob, float] | None:
        """The job the child is running now and when it started (epoch seconds)."""
        job_id = self.slot[SLOT_JOB]
        if not job_id:
            return None
        position = self.slot[SLOT_STARTED_COUNT] - self.reported - 1
        if 0 <= position < len(self.sent) and self.sent[position].id == job_id:
            return self.sent[position], self.slot[SLOT_STARTED_MS] / 1000
        return None

    def split_after_death(self) -> tuple[list[ClaimedJob], list[ClaimedJob]]:
        """(started, never started) among the unreported jobs of a dead child."""
        started = max(0, min(len(self.sent), self.slot[SLOT_STARTED_COUNT] - self.reported))
        jobs = list(self.sent)
        return jobs[:started], jobs[started:]


def acknowledged_in_shard(directory: str, shard: int, segments: int = 3) -> set[tuple[int, int]]:
    """(job id, attempt) of outcomes durable in the newest ``segments`` of a dead child's shard.

    Outcomes of jobs not yet reported live at the end of the shard's log: the child reports
    right after each commit, so only the last commits can be unreported.
    """
    found: set[tuple[int, int]] = set()
    for segno in list_segments(directory).get(shard, [])[-segments:]:
        try:
            buf = read_file(os.path.join(directory, segment_name(shard, segno)))
        except FileNotFoundError:
            continue
        for frame in parse(buf, shard, segno).data:
            try:
                outcome = Outcome.from_wire(orjson.loads(frame.payload))
            except ValueError:
                continue
            found.add((outcome.job_id, outcome.attempt))
    return found
