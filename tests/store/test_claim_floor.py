"""The claim floor (``shardworker.store.claim_floor``): a worker's next claim starts at the
smallest key its last claim took, so it skips the entries of jobs claimed before, which a
held xmin horizon keeps in the claim index; a job that appears before the floor waits at most
``FULL_SCAN_S``, and never when nothing else is due."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from shardworker.store.claim_floor import FULL_SCAN_S, ClaimFloor
from shardworker.store.pg_store import PgStore
from tests.store.support import add_id


def test_a_claim_starts_at_the_floor_and_a_job_before_it_waits_for_the_next_full_scan(store: PgStore) -> None:
    now = [100.0]  # the floor's clock, moved by hand: a slow machine cannot make a full scan early
    store.__dict__["_claim_floor"] = ClaimFloor(clock=lambda: now[0])
    first = add_id(store)
    assert [j.id for j in store.claim(["k"], None, "w1", 1)] == [first]
    early = add_id(store, run_at=datetime.now(UTC) - timedelta(hours=1))  # before the floor
    later = add_id(store)
    assert [j.id for j in store.claim(["k"], None, "w1", 1)] == [later]
    now[0] += FULL_SCAN_S
    assert [j.id for j in store.claim(["k"], None, "w1", 1)] == [early]


def test_a_claim_from_the_floor_that_finds_nothing_claims_from_the_head_at_once(store: PgStore) -> None:
    add_id(store)
    store.claim(["k"], None, "w1", 1)
    early = add_id(store, run_at=datetime.now(UTC) - timedelta(hours=1))
    assert [j.id for j in store.claim(["k"], None, "w1", 1)] == [early]


def test_the_floor_is_the_smallest_key_claimed_and_lapses_after_the_full_scan_interval() -> None:
    now = [100.0]
    floor = ClaimFloor(clock=lambda: now[0])
    t = datetime(2026, 1, 1, tzinfo=UTC)
    assert floor.params()["floor_id"] is None  # no claim yet: from the head
    assert floor.claimed([(0, t, 7), (0, t, 5), (1, t, 2)], floored=False) is False
    assert floor.params() == {"floor_priority": 0, "floor_run_at": t, "floor_id": 5}
    now[0] += FULL_SCAN_S
    assert floor.params()["floor_id"] is None
    assert floor.claimed([], floored=True) is True  # found nothing from a floor: again from the head
