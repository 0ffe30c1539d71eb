"""``ChildPool`` routing and work stealing, in-process: each child is a real ``ShardRunner``
on a thread, with a real shard writer and real pipes, attached to the pool's handle in
place of a process."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shardworker.app import App
from shardworker.child.main import Progress, ShardRunner, open_writer
from shardworker.core import procs, wire
from shardworker.core.model import ClaimedJob, Job
from shardworker.worker.child_handle import ChildHandle, Sent
from shardworker.worker.pool import ChildPool
from tests.helpers import child_config

SLOTS = 64


def make_app(ran: list[int], release: threading.Event, release_hold: threading.Event) -> App:
    app = App()

    @app.handler("ok")
    def ok(job: Job) -> int:
        ran.append(job.id)
        return job.id

    @app.handler("one", concurrency=1)
    def one(job: Job) -> int:
        ran.append(job.id)
        return job.id

    @app.handler("block")
    def block(job: Job) -> str:
        ran.append(job.id)
        assert release.wait(30)
        return "late"

    @app.handler("hold")
    def hold(job: Job) -> str:
        ran.append(job.id)
        assert release_hold.wait(30)
        return "late"

    return app


def job(job_id: int, kind: str = "ok") -> ClaimedJob:
    return ClaimedJob(job_id, kind, "default", "null", 1, 25)


class Pool:
    """A pool of two in-process children; ``ran[i]`` lists the jobs child i ran."""

    def __init__(self, tmp_path: Path) -> None:
        self.release, self.release_hold = threading.Event(), threading.Event()
        self.ran: list[list[int]] = [[], []]
        configs = [child_config(i, str(tmp_path), slots=SLOTS) for i in range(2)]
        apps = [make_app(ran, self.release, self.release_hold) for ran in self.ran]
        self.pool = ChildPool(configs, apps[0].handlers, min_jobs=4, max_jobs=SLOTS, max_bytes=1 << 20,
                              horizon_s=0.1)
        self.writers = []
        for handle, app in zip(self.pool.handles, apps, strict=True):
            to_child_r, to_child_w = os.pipe()
            from_child_r, from_child_w = os.pipe()
            array = [0] * Progress.width(SLOTS)
            writer = open_writer(handle.config)
            self.writers.append(writer)
            runner = ShardRunner(handle.config, app, writer, to_child_r, from_child_w, Progress(array, SLOTS))
            thread = threading.Thread(target=runner.run, daemon=True)
            thread.start()
            handle.attach(thread, wire.OutFrames(to_child_w), wire.InFrames(from_child_r), Progress(array, SLOTS))
        self.finished = 0

    def collect_until(self, finished: int, timeout_s: float = 10.0) -> None:
        """Drive the pool (as the dispatcher does) until ``finished`` jobs in all were reported."""
        deadline = time.monotonic() + timeout_s
        while self.finished < finished:
            assert time.monotonic() < deadline, f"{self.finished} of {finished} finished; ran {self.ran}"
            reads, writes = self.pool.wait_fds()
            procs.wait_ready(reads, writes, 0.05)
            self.finished += self.pool.collect()

    def collect_while(self, busy: Callable[[], bool], timeout_s: float = 10.0) -> None:
        """Drive the pool while ``busy()`` (fails after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while busy():
            assert time.monotonic() < deadline, f"still busy after {timeout_s}s; ran {self.ran}"
            reads, writes = self.pool.wait_fds()
            procs.wait_ready(reads, writes, 0.05)
            self.finished += self.pool.collect()

    def close(self) -> None:
        self.release.set()
        self.release_hold.set()
        self.pool.request_stop()
        self.pool.finish(time.monotonic() + 10, lambda n: None)
        for writer in self.writers:
            writer.close()


@pytest.fixture
def two(tmp_path: Path) -> Iterator[Pool]:
    pool = Pool(tmp_path)
    yield pool
    pool.close()


def test_jobs_routed_to_a_busy_child_run_on_an_idle_one(two: Pool) -> None:
    """Child 0 is held by a handler that does not return: the jobs routed to it (those held in
    the parent, and those sent and not started, taken back) run on child 1, and so do jobs
    routed to it later; once it reports again, it gets its own jobs again."""
    two.pool.send(0, [job(1, "block"), *(job(i) for i in range(2, 22))])
    two.collect_until(20)
    assert two.ran[0] == [1] and sorted(two.ran[1]) == list(range(2, 22))
    two.pool.send(0, [job(i) for i in range(30, 35)])
    two.collect_until(25)
    assert two.ran[0] == [1] and sorted(two.ran[1][20:]) == list(range(30, 35))
    assert two.pool.outstanding(0) == 1  # only the busy one
    two.release.set()
    two.collect_until(26)
    two.pool.send(0, [job(40)])
    two.collect_until(27)
    assert two.ran[0] == [1, 40]


def test_a_recalled_job_of_a_capped_kind_frees_its_place_under_the_cap(two: Pool) -> None:
    """A job of a kind capped at one in flight, sent to a busy child and taken back, no longer
    counts against the cap: the capped jobs all run on the idle child, one at a time."""
    two.pool.send(0, [job(1, "block"), job(2, "one"), job(3, "one"), job(4, "one")])
    assert two.pool.by_kind["one"] == 1  # one sent; the others wait for the cap
    two.collect_until(3)
    assert two.ran == [[1], [2, 3, 4]]
    assert two.pool.by_kind["one"] == 0


def test_a_child_whose_handlers_are_all_busy_gives_back_its_queue_though_no_child_is_idle(two: Pool) -> None:
    """Child 0 is stuck and child 1 busy (neither idle): child 0, finishing nothing, gives back
    the jobs queued behind its handler to the parent, where child 1 takes them once it has room."""
    two.pool.send(1, [job(1, "hold")])
    two.pool.send(0, [job(2, "block"), job(3), job(4)])
    two.collect_while(lambda: two.pool.outstanding(0) > 1)  # all but the running one, taken back
    assert two.ran == [[2], [1]]
    two.release_hold.set()
    two.collect_until(3)
    assert two.ran == [[2], [1, 3, 4]]


def test_waiting_since_tells_a_job_behind_running_handlers_from_a_child_still_starting() -> None:
    """The oldest unstarted job's send time, and whether a job sent before it started: a child
    that started nothing is still starting, not busy."""
    handle = ChildHandle(child_config(0, "/nonexistent", slots=4))
    handle.progress = Progress([0] * Progress.width(4), 4)
    handle.sent = {(1, 1): Sent(job(1), 0, 64, 10.0), (2, 1): Sent(job(2), 1, 64, 11.0)}
    assert handle.waiting_since() == (10.0, False)
    handle.progress.begin(0, 1)
    assert handle.waiting_since() == (11.0, True)
    handle.progress.begin(1, 2)
    assert handle.waiting_since() is None
