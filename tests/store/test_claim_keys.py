"""Claims with keys (a tenant's, ``enqueue(..., key=)``) on a real PostgreSQL: keys take
turns, so a key with a big backlog does not delay another's jobs; priority still comes
first; ``key_concurrency`` (a kind's, a queue's) caps one key's running jobs across workers
while other keys' jobs are claimed; a released worker's jobs hold no key slot; and with
10,000 keys queued the claim walks indexes, never the backlog."""

from __future__ import annotations

import re

from shardworker import JobSpec, enqueue_many
from shardworker.store.pg_store import PgStore
from tests.helpers import execute, query
from tests.store.support import generic_plan
from tests.store.test_claim_limits import register, set_queue


def flood(dsn: str, key: str | None, count: int, kind: str = "k", **options: object) -> list[int]:
    ids = enqueue_many(dsn, [JobSpec(kind, key=key, **options) for _ in range(count)])  # type: ignore[arg-type]
    return [i for i in ids if i is not None]


def test_a_key_with_a_big_backlog_does_not_delay_another_keys_jobs(store: PgStore, pg_dsn: str) -> None:
    """Key a has 300 jobs queued, key b enqueues 6 after them: claims of 4 take the two keys in
    turn, so b's six are all claimed within the first three claims (by priority, then id, b's
    would come after the 300)."""
    flood(pg_dsn, "a", 300)
    b = flood(pg_dsn, "b", 6)
    claims = [[j.key for j in store.claim(["k"], None, "w1", 4)] for _ in range(3)]
    assert all(sorted(keys) == ["a", "a", "b", "b"] for keys in claims), claims
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE id = ANY(%s) AND status = 'running'",
                 b) == [(6,)]


def test_jobs_without_a_key_take_turns_as_one_key(store: PgStore, pg_dsn: str) -> None:
    flood(pg_dsn, None, 50)
    flood(pg_dsn, "b", 50)
    assert sorted(str(j.key) for j in store.claim(["k"], None, "w1", 10)) == ["None"] * 5 + ["b"] * 5


def test_many_keys_are_each_served_once_before_any_twice(store: PgStore, pg_dsn: str) -> None:
    """Ten keys of 20 jobs each, claims of 5: every key gets its turn in the first two claims."""
    for n in range(10):
        flood(pg_dsn, f"t{n}", 20)
    served = [j.key for _ in range(2) for j in store.claim(["k"], None, "w1", 5)]
    assert sorted(served) == [f"t{n}" for n in range(10)], served


def test_priority_comes_before_the_turns(store: PgStore, pg_dsn: str) -> None:
    flood(pg_dsn, "a", 20)
    flood(pg_dsn, "b", 20)
    urgent = flood(pg_dsn, "a", 3, priority=-5)
    assert [j.id for j in store.claim(["k"], None, "w1", 3)] == urgent


def test_key_concurrency_of_a_kind_caps_one_key_across_workers_and_others_run(
        store: PgStore, other: PgStore, pg_dsn: str) -> None:
    """key_concurrency=2: worker 1 takes 2 of key a's 100 and 2 of b's 3; worker 2 then takes
    none of theirs (their slots are held) but 2 of c's, enqueued behind a's backlog; and once
    worker 1 is released (watched silent), its jobs hold no slot."""
    register(store, "k", key_concurrency=2)
    flood(pg_dsn, "a", 100)
    flood(pg_dsn, "b", 3)
    first = store.claim(["k"], None, "w1", 10)
    assert sorted(str(j.key) for j in first) == ["a", "a", "b", "b"]
    flood(pg_dsn, "c", 4)
    second = other.claim(["k"], None, "w2", 10)
    assert sorted(str(j.key) for j in second) == ["c", "c"]
    assert other.claim(["k"], None, "w2", 10) == []
    released = other.claim_within(["k"], None, "w2", 10, released=["w1"]).jobs
    assert sorted(str(j.key) for j in released) == ["a", "a", "b"]


def test_key_concurrency_of_a_queue_caps_one_key_of_every_kind_in_it(store: PgStore, pg_dsn: str) -> None:
    set_queue(pg_dsn, "mail", key_concurrency=1)
    flood(pg_dsn, "a", 5, kind="send", queue="mail")
    flood(pg_dsn, "a", 5, kind="digest", queue="mail")
    flood(pg_dsn, "a", 5, kind="send")  # another queue: not capped
    got = store.claim(["send", "digest"], None, "w1", 20)
    assert sorted((j.queue, j.key) for j in got) == [("default", "a")] * 5 + [("mail", "a")]


def test_a_queue_without_keys_writes_no_turn(store: PgStore, pg_dsn: str) -> None:
    flood(pg_dsn, None, 10)
    assert len(store.claim(["k"], None, "w1", 5)) == 5
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.key_turns") == [(0,)]


def test_with_ten_thousand_keys_queued_a_claim_walks_indexes_not_the_backlog(pg_dsn: str) -> None:
    """EXPLAIN of both claims' generic plans (as a worker's prepared statements run them) with
    10,000 keys queued, 20,000 jobs of one of them, and jobs without keys: every read of the
    jobs table is an index scan; the turn's probes and each key's jobs use the keys' index."""
    execute(pg_dsn, "INSERT INTO shardworker.jobs (kind, payload, key) SELECT 'k', '{}', 'big' "
                    "FROM generate_series(1, 20000)")
    execute(pg_dsn, "INSERT INTO shardworker.jobs (kind, payload, key) SELECT 'k', '{}', 'tenant-' || g "
                    "FROM generate_series(1, 10000) g")
    execute(pg_dsn, "INSERT INTO shardworker.jobs (kind, payload) SELECT 'k', '{}' FROM generate_series(1, 5000)")
    execute(pg_dsn, "INSERT INTO shardworker.kinds (name, key_concurrency) VALUES ('capped', 2)")
    execute(pg_dsn, "ANALYZE shardworker.jobs")
    for name in ("job_claim_plain", "job_claim"):
        plan = generic_plan(pg_dsn, name)
        assert not re.search(r"Seq Scan on jobs", plan), plan
        keys_index = r"Index Scan using jobs_queued_keys_idx on jobs(?: \w+)?\s+Index Cond: "
        probes = re.findall(keys_index + r"\(ROW\(\"left\"\(queue, 255\), key\) >", plan)
        assert len(probes) >= 2, plan  # the turn's first probe and its next ones
        own = keys_index + r"\(\(ROW\(\"left\"\(queue, 255\), key, priority, run_at, id\) >= ROW\("
        assert re.search(own, plan), plan  # a key's own jobs, from the claim floor


def test_every_limit_across_workers_is_listed_with_its_use(store: PgStore, pg_dsn: str) -> None:
    register(store, "api", global_concurrency=3, key_concurrency=2)
    register(store, "sms", rate="10/s")
    set_queue(pg_dsn, "mail", concurrency=4)
    execute(pg_dsn, "INSERT INTO shardworker.queues (name, paused) VALUES ('bulk', true)")
    flood(pg_dsn, "a", 5, kind="api")
    flood(pg_dsn, "b", 1, kind="api")
    store.claim(["api"], None, "w1", 10)
    limits = {(x.scope, x.name, x.limit): x for x in store.limits()}
    assert (limits["kind", "api", "global_concurrency"].in_use, limits["kind", "api", "global_concurrency"].full) \
        == (3, True)
    keys = limits["kind", "api", "key_concurrency"]
    assert (keys.value, keys.in_use, keys.keys_at_limit) == (2, 2, 1)
    assert limits["kind", "sms", "rate"].value == 10 and limits["kind", "sms", "rate"].in_use is None
    assert limits["queue", "mail", "concurrency"].text() == "queue mail: concurrency 0/4"
    assert limits["queue", "bulk", "paused"].text() == "queue bulk: paused (no worker claims its jobs)"


def test_jobs_without_a_key_are_served_every_claim_however_many_keys_take_turns(store: PgStore, pg_dsn: str) -> None:
    """20 old jobs without a key, then 10 keys of 20 jobs: claims of 5 take one job without a
    key each time, not none until every key is drained (found by a review)."""
    old = flood(pg_dsn, None, 20)
    for n in range(10):
        flood(pg_dsn, f"t{n}", 20)
    for _ in range(20):
        store.claim(["k"], None, "w1", 5)
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE id = ANY(%s) AND status = 'running'",
                 old) == [(20,)]


def test_a_capped_key_never_keeps_a_limited_kinds_or_queues_other_jobs_waiting(store: PgStore, pg_dsn: str) -> None:
    """Key x at its cap (1 running elsewhere) with 300 queued in front, then a job without a
    key and one of key y: a claim takes both (found by a review: the limited kind's and queue's
    candidates were x's, all filtered out)."""
    register(store, "k", key_concurrency=1)
    set_queue(pg_dsn, "q", key_concurrency=1)
    for kind, queue in (("k", "default"), ("other", "q")):
        execute(pg_dsn, "INSERT INTO shardworker.jobs (kind, queue, key, status, locked_by, attempt) "
                        "VALUES (%s, %s, 'x', 'running', 'w-other', 1)", kind, queue)
        flood(pg_dsn, "x", 300, kind=kind, queue=queue)
        flood(pg_dsn, None, 1, kind=kind, queue=queue)
        flood(pg_dsn, "y", 1, kind=kind, queue=queue)
    got = store.claim(["k", "other"], None, "w1", 10)
    assert sorted((j.kind, str(j.key)) for j in got) == [("k", "None"), ("k", "y"), ("other", "None"),
                                                          ("other", "y")]


def test_the_turn_passes_keys_this_worker_cannot_serve_without_spending_the_claim_on_them(
        store: PgStore, pg_dsn: str) -> None:
    """500 keys whose jobs are due tomorrow, 500 in a queue this worker does not claim from,
    then tenant x's flood and tenant y's three: y's first job comes within three claims, not
    after the walk has spent a hundred claims on keys it cannot serve (found by a review: the
    walk passes the other queue in one probe, and a few hundred keys without a due job a claim)."""
    execute(pg_dsn, "INSERT INTO shardworker.jobs (kind, key, run_at) SELECT 'k', 'later-' || lpad(g::text, 4, '0'), "
                    "now() + interval '1 day' FROM generate_series(1, 500) g")
    execute(pg_dsn, "INSERT INTO shardworker.jobs (kind, queue, key) SELECT 'k', 'bulk', 'bulk-' || g "
                    "FROM generate_series(1, 500) g")
    flood(pg_dsn, "x", 2000)
    flood(pg_dsn, "y", 3)
    assert "y" in [j.key for _ in range(3) for j in store.claim(["k"], ["default"], "w1", 4)]


def test_keys_at_their_cap_do_not_hold_the_turn_from_a_key_with_room(store: PgStore, pg_dsn: str) -> None:
    """300 tenants at key_concurrency=1 (one running elsewhere each, ten queued), then tenant
    zz with room: its job comes in the first claim, not after 75 empty ones (found by a review)."""
    register(store, "k", key_concurrency=1)
    execute(pg_dsn, "INSERT INTO shardworker.jobs (kind, key, status, locked_by, attempt) "
                    "SELECT 'k', 't' || lpad(g::text, 3, '0'), 'running', 'w-other', 1 FROM generate_series(1, 300) g")
    execute(pg_dsn, "INSERT INTO shardworker.jobs (kind, key) SELECT 'k', 't' || lpad((g % 300 + 1)::text, 3, '0') "
                    "FROM generate_series(1, 3000) g")
    flood(pg_dsn, "zz", 5)
    assert [j.key for j in store.claim(["k"], None, "w1", 4)] == ["zz"]


def test_a_keys_weight_gives_it_that_many_jobs_a_round(store: PgStore, pg_dsn: str) -> None:
    """queues limit default --weight acme=3: claims of 8 take six of acme's jobs and two of
    beta's (three to one), in both claims (the plain and the full)."""
    from shardworker import queues

    assert queues.limit(pg_dsn, "default", weights={"acme": 3}).key_weights == {"acme": 3}
    flood(pg_dsn, "acme", 100)
    flood(pg_dsn, "beta", 100)
    assert sorted(str(j.key) for j in store.claim(["k"], None, "w1", 8)) == ["acme"] * 6 + ["beta"] * 2
    register(store, "k", key_concurrency=50)  # the full claim, under a limit
    assert sorted(str(j.key) for j in store.claim(["k"], None, "w1", 8)) == ["acme"] * 6 + ["beta"] * 2


def test_keyed_claims_keep_a_claim_floor_that_passes_no_waiting_job(store: PgStore, pg_dsn: str) -> None:
    """Claims that served keys in turn start the next one at their first candidate (found by a
    review: they dropped the floor, and slowed down while a long transaction held the xmin
    horizon); every job is still claimed, none twice."""
    ids = flood(pg_dsn, "a", 30) + flood(pg_dsn, "b", 5) + flood(pg_dsn, None, 5)
    seen: list[int] = []
    for _ in range(20):
        got = store.claim(["k"], None, "w1", 4)
        if got:
            assert store.claim_floor().key is not None
        seen += [j.id for j in got]
    assert sorted(seen) == sorted(ids)


def test_a_released_workers_jobs_do_not_fill_the_limits_shown(store: PgStore, pg_dsn: str) -> None:
    """A worker silent past its --release-slots-after holds no slot in what queues and stats
    show either (found by a new user's trial: `workers` said released while `queues` said FULL)."""
    register(store, "api", global_concurrency=2, key_concurrency=1)
    execute(pg_dsn, "INSERT INTO shardworker.workers (worker_id, hostname, pid, heartbeat_at, slots_after_s) "
                    "VALUES ('w-dead', 'host', 1, now() - interval '30 seconds', 10)")
    execute(pg_dsn, "INSERT INTO shardworker.jobs (kind, key, status, attempt, locked_by) "
                    "SELECT 'api', 'acme', 'running', 1, 'w-dead' FROM generate_series(1, 2)")
    limits = {(x.scope, x.name, x.limit): x for x in store.limits()}
    assert limits["kind", "api", "global_concurrency"].in_use == 0
    assert limits["kind", "api", "key_concurrency"].keys_at_limit == 0
