"""Claims within limits on a real PostgreSQL: this worker's caps per kind, a kind's
global_concurrency and rate across workers (shardworker.kinds), a queue's pause,
concurrency and rate (shardworker.queues), and no head-of-line blocking: a limited kind's
backlog never keeps other jobs from being claimed."""

from __future__ import annotations

import threading
import time

from shardworker.app import App
from shardworker.store.pg_store import PgStore, StoreConfig
from tests.helpers import query
from tests.store.support import add_id, connect


def register(store: PgStore, kind: str, **limits: object) -> None:
    app = App()
    app.handler(kind, **limits)(lambda job: None)  # type: ignore[arg-type]
    store.register_kinds(list(app.handlers.values()))


def set_queue(dsn: str, name: str, **columns: object) -> None:
    names = ", ".join(columns)
    marks = ", ".join(["%s"] * len(columns))
    with connect(dsn) as conn:
        conn.execute(f"INSERT INTO shardworker.queues (name, {names}) VALUES (%s, {marks})",
                     (name, *columns.values()))


def test_a_capped_kind_takes_only_its_room_and_the_rest_of_the_claim_goes_to_others(store: PgStore) -> None:
    """100 jobs of a kind with room for 3 ahead of 5 others: a claim of 10 takes 3 + 5."""
    slow = [add_id(store, "slow") for _ in range(100)]
    fast = [add_id(store, "fast") for _ in range(5)]
    claim = store.claim_within(["slow", "fast"], None, "w1", 10, caps={"slow": 3})
    assert sorted(j.id for j in claim.jobs) == sorted(slow[:3] + fast)
    assert claim.pace_s is None
    assert store.claim_within(["slow"], None, "w1", 10, caps={"slow": 0}).jobs == []


def test_global_concurrency_counts_running_jobs_of_every_worker(store: PgStore, other: PgStore) -> None:
    """global_concurrency=4: worker a takes 3, worker b then only 1, and none once 4 run."""
    register(store, "api", global_concurrency=4)
    for _ in range(20):
        add_id(store, "api")
    add_id(store, "other")
    assert len(store.claim(["api"], None, "a", 3)) == 3
    got = other.claim(["api", "other"], None, "b", 10)
    assert sorted(j.kind for j in got) == ["api", "other"]
    assert store.claim(["api"], None, "a", 10) == []


def test_a_released_workers_running_jobs_hold_no_slot_of_a_kind_or_a_queue(
        store: PgStore, other: PgStore, pg_dsn: str) -> None:
    """global_concurrency=4 and a queue's concurrency 4: worker a runs 3 of each; b may take 1
    of each, and 3 more of each once a is released (watched silent past its --release-slots-after).
    The released worker's jobs stay its own, running."""
    register(store, "api", global_concurrency=4)
    set_queue(pg_dsn, "mail", concurrency=4)
    for _ in range(20):
        add_id(store, "api")
        add_id(store, "send", queue="mail")
    held = [j.id for j in store.claim(["api", "send"], None, "a", 6)]
    assert len(held) == 6
    got = other.claim_within(["api", "send"], None, "b", 10, released=["c"]).jobs
    assert sorted(j.kind for j in got) == ["api", "send"]
    got = other.claim_within(["api", "send"], None, "b", 10, released=["a"]).jobs
    assert sorted(j.kind for j in got) == ["api"] * 3 + ["send"] * 3  # b's own 1 of each still counts
    assert {r[0] for r in query(pg_dsn, "SELECT status FROM shardworker.jobs WHERE id = ANY(%s)", held)} == {"running"}


def test_run_room_bounds_a_limited_kind_but_not_the_others(store: PgStore) -> None:
    """A worker that can start 2 more handlers takes 2 jobs of a globally limited kind."""
    register(store, "api", global_concurrency=50)
    for _ in range(10):
        add_id(store, "api")
        add_id(store, "plain")
    claim = store.claim_within(["api", "plain"], None, "a", 100, run_room=2)
    assert sorted(j.kind for j in claim.jobs).count("api") == 2
    assert sorted(j.kind for j in claim.jobs).count("plain") == 10


def test_a_rate_starts_a_burst_then_refills_at_its_pace(store: PgStore) -> None:
    """rate 100/s holds a burst of 5: a claim after a quiet spell takes 5, one right after it
    only what refilled meanwhile (100 a second), and one 0.1 s later a full burst again; the
    claim says when to come back."""
    register(store, "api", rate="100/s")
    for _ in range(50):
        add_id(store, "api")
    time.sleep(0.2)
    started = time.monotonic()
    first = store.claim_within(["api"], None, "a", 50)
    assert len(first.jobs) == 5
    assert first.pace_s is not None and abs(first.pace_s - 0.05) < 1e-9
    second = store.claim(["api"], None, "a", 50)
    assert len(second) <= 100 * (time.monotonic() - started)
    time.sleep(0.1)
    assert len(store.claim(["api"], None, "a", 50)) == 5


def test_concurrent_claims_never_exceed_a_global_limit(pg_dsn: str, store: PgStore) -> None:
    """Eight connections claiming at once from a kind with global_concurrency=5 take 5 in all."""
    register(store, "api", global_concurrency=5)
    for _ in range(100):
        add_id(store, "api")
    taken: list[int] = []
    start = threading.Barrier(8)

    def claimer(n: int) -> None:
        s = PgStore(StoreConfig(dsn=pg_dsn, connect_timeout_s=3, statement_timeout_s=10))
        try:
            start.wait()
            for _ in range(5):
                taken.extend(j.id for j in s.claim(["api"], None, f"w{n}", 3))
        finally:
            s.close()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(taken) == len(set(taken)) == 5


def test_a_paused_queue_is_skipped_and_resumes_where_it_was(pg_dsn: str, store: PgStore) -> None:
    """Jobs of a paused queue are not claimed; the other queues' are."""
    held = add_id(store, "k", queue="uploads")
    free = add_id(store, "k", queue="default")
    set_queue(pg_dsn, "uploads", paused=True)
    assert [j.id for j in store.claim(["k"], None, "w1", 10)] == [free]
    with connect(pg_dsn) as conn:
        conn.execute("UPDATE shardworker.queues SET paused = false WHERE name = 'uploads'")
    assert [j.id for j in store.claim(["k"], None, "w1", 10)] == [held]


def test_a_queue_limit_counts_its_running_jobs_of_every_kind(pg_dsn: str, store: PgStore, other: PgStore) -> None:
    """A queue limited to 3 gives 2 to one worker and 1 to the next, whatever the kinds."""
    set_queue(pg_dsn, "partner", concurrency=3)
    for kind in ("a", "b") * 5:
        add_id(store, kind, queue="partner")
    add_id(store, "a", queue="default")
    assert len(store.claim(["a", "b"], ["partner"], "w1", 2)) == 2
    got = other.claim(["a", "b"], None, "w2", 10)
    assert sorted(j.queue for j in got) == ["default", "partner"]
    assert store.claim(["a", "b"], None, "w1", 10) == []


def test_a_queue_rate_paces_its_claims(pg_dsn: str, store: PgStore) -> None:
    """A queue limited to 20/s holds one job's burst: one claim, then only what refilled
    meanwhile (one job per 50 ms)."""
    set_queue(pg_dsn, "partner", rate_limit=20, rate_period_s=1.0)
    for _ in range(10):
        add_id(store, "k", queue="partner")
    time.sleep(0.1)
    started = time.monotonic()
    first = store.claim_within(["k"], None, "w1", 10)
    assert len(first.jobs) == 1 and first.pace_s is not None
    assert len(store.claim(["k"], None, "w1", 10)) <= 20 * (time.monotonic() - started)


def test_registering_again_without_limits_clears_them(pg_dsn: str, store: PgStore) -> None:
    """The last worker to start sets a kind's limits; without them the kind is unlimited."""
    register(store, "api", global_concurrency=1, rate="5/m")
    register(store, "api")
    with connect(pg_dsn) as conn:
        found = conn.execute("SELECT global_concurrency, rate_limit FROM shardworker.kinds WHERE name = 'api'")
        assert found.fetchall() == [(None, None)]
    for _ in range(3):
        add_id(store, "api")
    assert len(store.claim(["api"], None, "w1", 10)) == 3


def test_a_claim_that_fails_inside_its_transaction_leaves_the_session_usable(pg_dsn: str) -> None:
    """A claim that times out waiting for a limited kind's lock (another session holds it)
    fails as a transient conflict; the next claim on the same store works."""
    from shardworker.errors import TransientConflict

    store = PgStore(StoreConfig(dsn=pg_dsn, connect_timeout_s=3, statement_timeout_s=0.5))
    try:
        register(store, "api", global_concurrency=5)
        job = add_id(store, "api")
        with connect(pg_dsn) as holder:
            holder.execute("BEGIN")
            holder.execute("SELECT * FROM shardworker.kinds WHERE name = 'api' FOR UPDATE")
            try:
                store.claim(["api"], None, "w1", 10)
                raise AssertionError("the claim did not wait for the lock")
            except TransientConflict:
                pass
            holder.execute("ROLLBACK")
        assert [j.id for j in store.claim(["api"], None, "w1", 10)] == [job]
    finally:
        store.close()
