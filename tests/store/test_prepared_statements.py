"""The worker's hot statements run prepared on a direct connection (``Session.prepares``):
the claim with one generic plan whose index scan starts at the claim floor, the apply with
one too, each made again every PLAN_REFRESH_S. Through a transaction pool nothing is prepared
(tests/cli/test_pgbouncer.py)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from shardworker.store import plans
from shardworker.store.claim_floor import FULL_SCAN_S, ClaimFloor
from shardworker.store.pg_store import PgStore
from shardworker.store.plans import PLAN_REFRESH_S
from shardworker.store.sql import query, to_native
from tests.store.support import add_id, claim_one, connect, done, generic_plan, row


def prepared(store: PgStore) -> list[tuple[str, int, int]]:
    """The first line of each statement prepared on the store's connection, its generic and custom plans."""
    with store.cursor() as cur:
        rows = cur.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements").fetchall()
    return [(text.lstrip().splitlines()[0], generic, custom) for text, generic, custom in rows]


def first_line(name: str) -> str:
    return query(name).lstrip().splitlines()[0]


def test_the_claims_and_the_apply_are_prepared_again_after_a_reconnect(store: PgStore) -> None:
    for _ in range(2):  # the second time on a new connection
        add_id(store)
        store.apply_outcomes([done(claim_one(store))])
        add_id(store)
        store.claim_within(["k"], None, "w1", 1, caps={"k": 1})  # the full claim: within caps of its own
        assert {first for first, _, _ in prepared(store)} == {first_line(name) for name in (
            "job_claim_plain", "flow_lock_kinds", "flow_lock_queues", "job_claim", "job_apply_outcomes")}
        store.close()


def test_the_apply_and_the_claim_are_planned_once(store: PgStore) -> None:
    for _ in range(8):  # past the five custom plans after which the server may settle on a generic one
        add_id(store)
        store.apply_outcomes([done(claim_one(store))])
    plans: dict[str, list[int]] = {}
    for first, generic, custom in prepared(store):  # (psycopg prepares once per set of parameter types)
        plans.setdefault(first, [0, 0])[0] += generic
        plans[first][1] += custom
    assert plans[first_line("job_apply_outcomes")] == [8, 0]
    assert plans[first_line("job_claim_plain")] == [8, 0]


@pytest.fixture
def generic(store: PgStore) -> PgStore:
    """The store, its claims on their generic plan from the first."""
    with store.cursor() as cur:
        cur.execute("SET plan_cache_mode = force_generic_plan")
    return store


def test_on_its_generic_plan_a_claim_starts_at_the_floor_and_a_job_before_it_waits(generic: PgStore,
                                                                                  pg_dsn: str) -> None:
    now = [100.0]
    generic.__dict__["_claim_floor"] = ClaimFloor(clock=lambda: now[0])
    first = add_id(generic)
    assert [j.id for j in generic.claim(["k"], None, "w1", 1)] == [first]
    early = add_id(generic, run_at=datetime.now(UTC) - timedelta(hours=1))
    later = add_id(generic)
    assert [j.id for j in generic.claim(["k"], None, "w1", 1)] == [later]
    now[0] += FULL_SCAN_S
    assert [j.id for j in generic.claim(["k"], None, "w1", 1)] == [early]
    assert row(pg_dsn, early)["status"] == "running"


@pytest.mark.parametrize("name", ["job_claim_plain", "job_claim"])
def test_the_generic_claim_plan_bounds_its_index_scan_by_the_floor(pg_dsn: str, name: str) -> None:
    """The point of the floor under a held xmin horizon: the scan starts there. An ``x IS
    NULL OR key >= x`` condition is no index bound on a generic plan; the floor's is."""
    plan = generic_plan(pg_dsn, name)
    bound = (r"Index Scan using jobs_claim_idx on jobs(?: \w+)?\s+"
             r"Index Cond: \(\(?ROW\(priority, run_at, id\) >= ROW\(COALESCE\(\$")
    assert re.search(bound, plan), plan


def apply_plan(store: PgStore) -> str:
    """The plan the store's connection holds for its prepared apply (EXPLAIN EXECUTE uses it)."""
    with store.cursor() as cur:
        (name,) = [n for n, text in cur.execute("SELECT name, statement FROM pg_prepared_statements")
                   if text.lstrip().startswith(first_line("job_apply_outcomes"))]
        params = ", ".join(["NULL"] * len(to_native(query("job_apply_outcomes"))[1]))
        return "\n".join(r[0] for r in cur.execute(f"EXPLAIN (COSTS OFF) EXECUTE {name}({params})"))


def test_a_plan_made_while_the_table_was_small_is_made_again_within_the_refresh(
        store: PgStore, pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The apply's plan, made on an all but empty table, scans the whole table; 20,000 rows
    later (no vacuum or analyze to make it again meanwhile) it still does, until
    PLAN_REFRESH_S has passed: then it looks each outcome's job up by primary key."""
    now = [1000.0]
    monkeypatch.setattr(plans, "monotonic", lambda: now[0])
    with connect(pg_dsn) as conn:
        conn.execute("ALTER TABLE shardworker.jobs SET (autovacuum_enabled = false)")
    add_id(store)
    store.apply_outcomes([done(claim_one(store))])
    with connect(pg_dsn) as conn:
        conn.execute("INSERT INTO shardworker.jobs (kind, payload, status) "
                     "SELECT 'k', 'null', 'done' FROM generate_series(1, 20000)")
    add_id(store)
    store.apply_outcomes([done(claim_one(store))])
    assert "Seq Scan on jobs j" in apply_plan(store)
    now[0] += PLAN_REFRESH_S
    add_id(store)
    store.apply_outcomes([done(claim_one(store))])
    plan = apply_plan(store)
    assert "Index Cond: (id = o.id)" in plan and "Seq Scan on jobs" not in plan, plan
