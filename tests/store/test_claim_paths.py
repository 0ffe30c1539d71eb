"""The two ways a claim goes to PostgreSQL (``shardworker.store.claiming``).

With no limit in its way (no cap of the worker's own, none of its kinds or queues limited
across workers or paused) a claim is one statement, ``job_claim_plain``, in a transaction
of its own: what the protocol carries is checked with libpq's own trace. Once a limit
appears, whoever set it, the very next claim keeps it (the plain statement claims nothing
and says so; the full claim runs); once the limits are gone, claims go plain again after
``FLOW_RECHECK_S``."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest

from shardworker.app import App
from shardworker.client import enqueue
from shardworker.core.model import ClaimedJob, Outcome, StepRecord
from shardworker.store import claiming
from shardworker.store.pg_store import PgStore, StoreConfig
from tests.store.support import add_id, frontend_messages


def register(store: PgStore, kind: str, **limits: object) -> None:
    app = App()
    app.handler(kind, **limits)(lambda job: None)  # type: ignore[arg-type]
    store.register_kinds(list(app.handlers.values()))


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    now = [1000.0]
    monkeypatch.setattr(claiming, "monotonic", lambda: now[0])
    yield now


def test_a_claim_with_no_limit_in_its_way_is_one_statement(store: PgStore) -> None:
    """One Execute and one Sync: no BEGIN, no locking of limit rows, no COMMIT."""
    for _ in range(2):  # connected, and prepared where it is (from the queue's head, then from the floor)
        add_id(store)
        store.claim(["k"], None, "w1", 10)
    job = add_id(store)
    claims: list[int] = []
    sent = frontend_messages(store, lambda: claims.extend(j.id for j in store.claim(["k"], None, "w1", 10)))
    assert claims == [job]
    assert sent.count("Execute") == 1, sent
    assert sent.count("Sync") == 1, sent


def test_a_claim_within_caps_of_its_own_is_the_full_claim(store: PgStore) -> None:
    add_id(store)
    sent = frontend_messages(store, lambda: store.claim_within(["k"], None, "w1", 10, caps={"k": 5}))
    assert sent.count("Execute") == 5, sent  # BEGIN, the kinds' and the queues' locks, the claim, COMMIT


def test_a_queue_paused_by_an_operator_holds_from_the_next_claim(store: PgStore, other: PgStore,
                                                                clock: list[float]) -> None:
    first, second = add_id(store, queue="q1"), add_id(store, queue="q1")
    elsewhere = add_id(store, queue="q2")
    assert [j.id for j in store.claim(["k"], None, "w1", 1)] == [first]
    other.pause_queue("q1")
    assert [j.id for j in store.claim(["k"], None, "w1", 10)] == [elsewhere]
    assert store.claim(["k"], None, "w1", 10) == []
    other.resume_queue("q1")
    assert [j.id for j in store.claim(["k"], None, "w1", 10)] == [second]


def test_a_concurrency_another_worker_sets_holds_from_the_next_claim(store: PgStore, other: PgStore,
                                                                    clock: list[float]) -> None:
    """A kind gets a global concurrency of 1 from a worker started later: this worker, which
    has claimed plainly so far, claims one job of it at a time from then on."""
    jobs = [add_id(store, "slow") for _ in range(4)]
    assert [j.id for j in store.claim(["slow"], None, "w1", 1)] == jobs[:1]
    register(other, "slow", global_concurrency=2)
    assert [j.id for j in store.claim(["slow"], None, "w1", 10)] == jobs[1:2]
    assert store.claim(["slow"], None, "w1", 10) == []


def test_claims_go_plain_again_a_while_after_the_limits_are_gone(store: PgStore, clock: list[float]) -> None:
    add_id(store, queue="q1")
    store.pause_queue("q1")
    full = frontend_messages(store, lambda: store.claim(["k"], None, "w1", 10))
    assert full.count("Execute") == 6, full  # the plain statement said "limited", then the full claim
    assert frontend_messages(store, lambda: store.claim(["k"], None, "w1", 10)).count("Execute") == 5
    store.resume_queue("q1")
    assert frontend_messages(store, lambda: store.claim(["k"], None, "w1", 10)).count("Execute") == 5
    add_id(store, queue="q1")
    clock[0] += claiming.FLOW_RECHECK_S
    claims: list[int] = []
    sent = frontend_messages(store, lambda: claims.extend(j.id for j in store.claim(["k"], None, "w1", 10)))
    assert sent.count("Execute") == 1 and len(claims) == 1, sent


def scene(store: PgStore, dsn: str, kind: str) -> list[int]:
    """Jobs of ``kind`` in every shape a claim reads: priorities, one retried with a step
    recorded, one that waited on another's result, payloads of 400 bytes and one of 3,000."""
    first = add_id(store, kind, priority=-1)
    (job,) = store.claim([kind], None, "setup", 1)
    store.apply_outcomes([Outcome.done(job.id, job.attempt, b'{"n": 1}')])
    retried = add_id(store, kind, priority=-5, max_attempts=9)
    (job,) = store.claim([kind], None, "setup", 1)
    store.apply_outcomes([Outcome.retry(job.id, job.attempt, "boom", 0.0)],
                         [StepRecord(job.id, job.attempt, "fetch", b'{"rows": 3}', 1.0)])
    waited = enqueue(dsn, kind, {"x": 1}, after=[first])
    big = add_id(store, kind, payload=orjson.dumps({"pad": "x" * 3000}).decode(), priority=2)
    small = [add_id(store, kind, payload=orjson.dumps({"pad": "y" * 400}).decode(), priority=1) for _ in range(3)]
    return [retried, waited or 0, *small, big]


def shape(jobs: list[ClaimedJob], ids: list[int]) -> list[tuple[object, ...]]:
    return [(ids.index(j.id), j.queue, j.payload_json, j.attempt, j.max_attempts, j.steps_json,
             j.dependencies_json and j.dependencies_json.split(":", 1)[1], j.snoozes) for j in jobs]


def test_the_plain_and_the_full_claim_take_the_same_jobs_and_return_the_same(store: PgStore, other: PgStore,
                                                                            pg_dsn: str) -> None:
    """Claims of up to 1,500 bytes and 10 jobs until none is left: plainly by one worker, and
    (within a cap too large to matter) the full way by another; attempts lowered at a first
    claim. (Each worker's claim floor is its own.)"""
    setup = PgStore(StoreConfig(dsn=pg_dsn))
    plain_ids, full_ids = scene(setup, pg_dsn, "plain"), scene(setup, pg_dsn, "full")
    setup.close()
    plain, full = [], []
    for _ in range(3):
        plain.append(store.claim_within(["plain"], None, "w1", 10, max_bytes=1500, attempts={"plain": 4}))
        full.append(other.claim_within(["full"], None, "w2", 10, max_bytes=1500, attempts={"full": 4},
                                       caps={"full": 100}))
    assert [shape(c.jobs, plain_ids) for c in plain] == [shape(c.jobs, full_ids) for c in full]
    assert [len(c.jobs) for c in plain] == [5, 1, 0]  # the big one alone, as the first of its claim
    assert {c.pace_s for c in plain + full} == {None}
