"""``Dispatcher.run_once`` driven in-process on a real PostgreSQL: the store is a real
``PgStore`` behind ``FlakyStore`` (chosen calls fail), the children are an in-process
stand-in that records what it was sent, the clock is injected. No processes."""

from __future__ import annotations

from pathlib import Path

from outbox import OutboxReader
from shardworker.core import wire
from shardworker.core.layout import PARENT_SHARD
from shardworker.core.model import ClaimedJob, Disposition
from shardworker.core.routing import shard_for
from shardworker.errors import NotConnected, TransientConflict
from shardworker.worker.deaths import Death
from tests.flaky_store import FlakyStore
from tests.helpers import enqueue
from tests.worker.dispatcher_harness import job_rows, make


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


def test_the_database_is_back_once_the_flusher_applies_even_while_claims_wait(
        pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """After a failed claim the watch says the database is down; a batch the flusher began
    since and applied (claims still waiting out their backoff, or paused for a backlog) says it
    is back. One that began before the failure and landed after it says nothing: its commit
    may have beaten the cut (it once logged "back after 0.0s" between two outage lines)."""
    enqueue(pg_dsn, "k", 5)
    dispatcher, _, flusher, clock = make(store, tmp_path)
    flusher.batch_started_at = clock.now - 0.001
    clock.now += 0.01
    store.fail("claim_within", times=1)
    dispatcher.run_once()
    assert not dispatcher.watch.up and dispatcher.watch.outages == 1
    flusher.flushed_total += 3  # applied now, but begun before the claim failed
    dispatcher.run_once()
    assert not dispatcher.watch.up
    clock.now += 0.01
    flusher.flushed_total += 3
    flusher.batch_started_at = clock.now
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
