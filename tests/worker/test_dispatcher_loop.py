"""``Dispatcher.run_once`` driven in-process on a real PostgreSQL: the store is a real
``PgStore`` behind ``FlakyStore`` (chosen calls fail), the children are an in-process
stand-in that records what it was sent, the clock is injected. No processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from outbox import OutboxReader
from shardworker import wire
from shardworker.app import App
from shardworker.config import WorkerConfig
from shardworker.errors import NotConnected, TransientConflict
from shardworker.jobstats import JobCounts
from shardworker.layout import PARENT_SHARD
from shardworker.model import ClaimedJob, Disposition
from shardworker.routing import shard_for
from shardworker.store.pg_store import PgStore, StoreConfig
from shardworker.worker.deaths import Death
from shardworker.worker.dispatcher import Dispatcher
from shardworker.worker.parent_outcomes import ParentOutcomes
from tests.flaky_store import FlakyStore
from tests.helpers import enqueue, query


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Children:
    """Stands in for ``ChildPool``: keeps what it is sent; the test decides what finishes or dies."""

    def __init__(self, n: int, max_jobs: int) -> None:
        self.max_jobs, self.at_once = max_jobs, 1  # its share, and of it what one child runs at once
        self.sent: list[dict[wire.JobKey, ClaimedJob]] = [{} for _ in range(n)]
        self.finished = 0
        self.deaths: list[Death] = []
        self.job_counts = JobCounts()  # what the children's reports carried (steps recorded, for the backlog)
        self.attempts: dict[str, int] = {}  # no handler sets max_attempts

    def __len__(self) -> int:
        return len(self.sent)

    def outstanding(self, index: int) -> int:
        return len(self.sent[index])

    def target(self, index: int) -> int:
        return self.max_jobs

    def held_bytes(self) -> int:
        return 0

    def cap_rooms(self) -> dict[str, int]:
        return {}

    def run_room(self) -> int:
        return sum(max(0, self.max_jobs - len(s)) for s in self.sent)

    @property
    def in_flight(self) -> int:
        return sum(len(s) for s in self.sent)

    def send(self, index: int, jobs: list[ClaimedJob]) -> None:
        self.sent[index].update({(j.id, j.attempt): j for j in jobs})

    def finish(self, index: int, count: int) -> None:
        for key in list(self.sent[index])[:count]:
            del self.sent[index][key]
            self.finished += 1

    def collect(self) -> int:
        finished, self.finished = self.finished, 0
        return finished

    def check(self) -> list[Death]:
        deaths, self.deaths = self.deaths, []
        return deaths

    def wait_fds(self) -> tuple[list[int], list[int]]:
        return [], []

    def job_ids(self) -> list[int]:
        return [i for sent in self.sent for i, _ in sent]


class Flusher:
    """Stands in for ``FlusherHandle``: the test sets how much was flushed."""

    def __init__(self) -> None:
        self.flushed_total = 0
        self.idle = True
        self.failing = ""

    def check(self) -> None:
        pass


@pytest.fixture
def store(pg_dsn: str) -> Any:
    s = PgStore(StoreConfig(dsn=pg_dsn, connect_timeout_s=3, statement_timeout_s=5))
    yield FlakyStore(s)
    s.close()


def make(store: FlakyStore, tmp_path: Path, procs: int = 3, **config: Any) -> tuple[Dispatcher, Children, Flusher,
                                                                                    Clock]:
    app = App()
    app.handler("k", retry_delay=lambda attempt: 2.5)(lambda job: None)
    prefetch = config.pop("prefetch", 1000)
    settings = {"claim_batch": 500, "poll_interval_s": 0.01, **config}
    cfg = WorkerConfig(dsn="unused", app_ref="unused", procs=procs, outbox_dir=str(tmp_path), **settings)
    children, flusher, clock = Children(procs, prefetch), Flusher(), Clock()
    dispatcher = Dispatcher(cfg, "w1", ["k"], store, children, flusher,  # type: ignore[arg-type]
                            ParentOutcomes(str(tmp_path), 1 << 20, app.handlers), stopping=lambda: False, clock=clock)
    return dispatcher, children, flusher, clock


def job_rows(dsn: str) -> list[tuple[Any, ...]]:
    return query(dsn, "SELECT id, status, attempt, locked_by FROM shardworker.jobs ORDER BY id")


def test_claimed_jobs_go_to_the_child_of_their_shard(pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """One pass claims every due job for this worker and sends each to child shard_for(id, procs)."""
    ids = enqueue(pg_dsn, "k", 60)
    dispatcher, children, _, _ = make(store, tmp_path)
    dispatcher.run_once()
    assert all(r[1:] == ("running", 1, "w1") for r in job_rows(pg_dsn))
    for index, sent in enumerate(children.sent):
        assert sorted(i for i, _ in sent) == [i for i in ids if shard_for(i, 3) == index]
    assert dispatcher.claimed_total == 60


def test_claims_are_bounded_by_the_childrens_room(pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """Claims never exceed the room the children have, each child's counted alone (procs x
    prefetch_per_child, less what each holds, a child over its share counting 0), and wait until
    some child runs low (a quarter of its share or less) rather than claim for each job finished:
    a claim is a transaction. (This stand-in keeps what hash routing sends beyond a child's
    share; the pool gives it to a child with room.)"""
    enqueue(pg_dsn, "k", 200)
    dispatcher, children, _, _ = make(store, tmp_path, procs=2, prefetch=10, claim_batch=50)
    dispatcher.run_once()
    assert children.in_flight == dispatcher.claimed_total == 20  # both children's room
    children.finish(0, 1)
    children.finish(1, 1)
    for _ in range(5):
        dispatcher.run_once()
    assert dispatcher.claimed_total == 20  # each child still holds most of its share: no claim
    finished = 2 + children.outstanding(0)
    children.finish(0, children.outstanding(0))
    rooms = 10 + max(0, 10 - children.outstanding(1))
    dispatcher.run_once()
    assert 20 < dispatcher.claimed_total <= 20 + rooms  # child 0 ran dry: a claim that fits the room
    assert children.in_flight == dispatcher.claimed_total - finished
    assert dispatcher.done_total == finished


def test_a_claim_whose_reply_was_lost_is_given_back(pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """When the server committed a claim but the reply was lost, those jobs are released (attempt
    undone) before the next claim, so no job is held by nobody or claimed at attempt 2."""
    enqueue(pg_dsn, "k", 10)
    dispatcher, children, _, clock = make(store, tmp_path)
    store.fail("claim_within", times=1, after=True)
    dispatcher.run_once()
    assert children.in_flight == 0
    assert {r[1] for r in job_rows(pg_dsn)} == {"running"}  # claimed on the server, unknown here
    clock.now += 60  # past the backoff
    dispatcher.run_once()
    assert store.calls["release_claim"] == 1
    assert children.in_flight == 10
    assert {r[1:] for r in job_rows(pg_dsn)} == {("running", 1, "w1")}


def test_a_failed_claim_waits_out_its_backoff_on_the_injected_clock(
        pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """After a failed claim no claim is tried until the backoff has passed on the clock."""
    enqueue(pg_dsn, "k", 5)
    dispatcher, children, _, clock = make(store, tmp_path)
    store.fail("claim_within", times=1)
    dispatcher.run_once()
    dispatcher.run_once()
    assert store.calls["claim_within"] == 1 and not dispatcher.db_ok
    clock.now += 60
    dispatcher.run_once()
    assert store.calls["claim_within"] == 2 and dispatcher.db_ok
    assert children.in_flight == 5


def test_claiming_pauses_while_the_flusher_is_behind(pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """With more than max_backlog outcomes durable but not flushed, nothing is claimed until it catches up."""
    enqueue(pg_dsn, "k", 40)
    dispatcher, children, flusher, _ = make(store, tmp_path, procs=1, max_backlog=10, claim_batch=20,
                                            prefetch=20)
    dispatcher.run_once()
    children.finish(0, 20)
    dispatcher.run_once()  # counts 20 finished: the backlog is 20 > 10
    claimed = dispatcher.claimed_total
    dispatcher.run_once()
    assert dispatcher.claimed_total == claimed and "behind" in dispatcher.pause_reason
    flusher.flushed_total = 20
    dispatcher.run_once()
    assert dispatcher.claimed_total == 40


def test_a_dead_childs_lost_jobs_fail_in_the_parents_shard(pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """Started jobs a dead child left without an outcome get a failure (with the handler's retry
    delay) written durably to the parent's shard, and count as finished."""
    enqueue(pg_dsn, "k", 4)
    dispatcher, children, _, _ = make(store, tmp_path, procs=1)
    dispatcher.run_once()
    jobs = list(children.sent[0].values())
    children.sent[0].clear()
    children.deaths.append(Death(0, "worker process died (exit code -9)", 1, tuple(jobs[:2]), ()))
    dispatcher.run_once()
    assert dispatcher.done_total == 3
    with OutboxReader.open(str(tmp_path)) as reader:
        records = [(r.shard, wire.decode_outcome(r.payload)) for r in reader.poll(100)]
    assert [(shard, o.job_id, o.disposition, o.error, o.delay_s) for shard, o in records] == [
        (PARENT_SHARD, j.id, Disposition.RETRY, "worker process died (exit code -9)", 2.5) for j in jobs[:2]]


def test_give_back_releases_unstarted_jobs(pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """At shutdown, jobs no child started go back to queued with their attempt undone, even after a failure."""
    enqueue(pg_dsn, "k", 6)
    dispatcher, children, _, _ = make(store, tmp_path, procs=1)
    dispatcher.run_once()
    keys = list(children.sent[0])
    store.fail("release", times=2)
    assert dispatcher.give_back(keys[:4], deadline=dispatcher.clock() + 30) == 4
    states = [r[1:3] for r in job_rows(pg_dsn)]
    assert states.count(("queued", 0)) == 4 and states.count(("running", 1)) == 2


def test_exit_when_idle_once_nothing_is_due_or_held(pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """With exit_when_idle, run_once says stop only when no job is due or in flight and the outbox is empty."""
    enqueue(pg_dsn, "k", 2)
    dispatcher, children, flusher, clock = make(store, tmp_path, procs=1, exit_when_idle=True)
    assert dispatcher.run_once() is False  # claims the two
    clock.now += 1
    assert dispatcher.run_once() is False  # they are in flight
    children.finish(0, 2)
    query(pg_dsn, "UPDATE shardworker.jobs SET status = 'done', locked_by = NULL RETURNING id")
    dispatcher.run_once()
    flusher.flushed_total = 2
    clock.now += 1
    assert dispatcher.run_once() is True


def test_the_database_is_back_once_the_flusher_applies_even_while_claims_wait(
        pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """After a failed claim the watch says the database is down; outcomes applied since (claims
    still waiting out their backoff, or paused for a backlog) say it is back."""
    enqueue(pg_dsn, "k", 5)
    dispatcher, _, flusher, _ = make(store, tmp_path)
    store.fail("claim_within", times=1)
    dispatcher.run_once()
    assert not dispatcher.watch.up and dispatcher.watch.outages == 1
    dispatcher.run_once()
    assert not dispatcher.watch.up  # nothing applied since: still down
    flusher.flushed_total += 3
    dispatcher.run_once()
    assert dispatcher.watch.up and store.calls["claim_within"] == 1


def test_a_conflict_is_not_an_outage_and_a_refused_connect_is_not_a_lost_claim(
        pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    enqueue(pg_dsn, "k", 5)
    dispatcher, _, _, clock = make(store, tmp_path)
    store.fail("claim_within", times=1, make=lambda: TransientConflict("transient conflict: deadlock detected"))
    dispatcher.run_once()
    assert dispatcher.watch.up and dispatcher.db_errors == 1
    assert len(dispatcher.lost_claims) == 1  # it may have been sent: given back before the next claim
    clock.now += 60
    store.fail("claim_within", times=1, make=lambda: NotConnected("database unavailable: connection refused"))
    dispatcher.run_once()
    assert not dispatcher.watch.up
    assert dispatcher.lost_claims == []  # the earlier one released; the refused one never reached the server


def test_a_child_over_its_share_does_not_stop_claims_for_the_others(
        pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """A child holding more than its share (stuck behind a long handler) has no room, and takes
    none from the others: claims go on, sized by the room of the children that have it."""
    enqueue(pg_dsn, "k", 100)
    dispatcher, children, _, _ = make(store, tmp_path, procs=2, prefetch=10, claim_batch=50)
    children.send(0, [ClaimedJob(10_000 + i, "k", "default", "null", 1, 25) for i in range(30)])  # stuck there
    dispatcher.run_once()
    assert dispatcher.claimed_total == 10  # child 1's room; child 0 (30 of 10) counts 0, not -20
