"""Dependencies and follow-up jobs in the store, on a real PostgreSQL: what `after=` does at
enqueue, what applying an outcome does to the jobs waiting on it (released, or cancelled
transitively), follow-ups inserted only with a done outcome and only once, and what the
operator commands and retention do around them."""

from __future__ import annotations

import threading
import time

import orjson
import psycopg
import pytest

from shardworker import jobs
from shardworker.client import JobSpec, enqueue, enqueue_many
from shardworker.core.model import Outcome
from shardworker.errors import EnqueueError
from shardworker.store.pg_store import PgStore
from tests.helpers import query


def row(dsn: str, job_id: int) -> tuple[str, str | None]:
    status, error = query(dsn, "SELECT status, last_error FROM shardworker.jobs WHERE id = %s", job_id)[0]
    return status, error


def finish(store: PgStore, kind: str, result: object = None, *, followups: list[list[object]] | None = None,
           how: str = "done") -> int:
    """Claim the one queued job of ``kind`` and apply an outcome for it; its id."""
    (job,) = store.claim([kind], None, "w1", 1)
    blob = orjson.dumps(followups) if followups else None
    outcome = (Outcome.done(job.id, job.attempt, orjson.dumps(result), blob) if how == "done"
               else Outcome.failed(job.id, job.attempt, "boom"))
    store.apply_outcomes([outcome])
    return job.id


def followup(kind: str, after: list[int] = (), payload: object = None) -> list[object]:  # type: ignore[assignment]
    return [kind, orjson.dumps(payload).decode(), "default", 0, 25, 0.0, None, list(after)]


def test_a_job_waits_until_its_last_dependency_is_done_then_sees_their_results(pg_dsn: str, store: PgStore) -> None:
    a = enqueue(pg_dsn, "a")
    b = enqueue(pg_dsn, "b")
    assert a and b
    merge = enqueue(pg_dsn, "merge", {"doc": 1}, after=[a, b])
    assert merge and row(pg_dsn, merge)[0] == "waiting"
    assert store.claim(["merge"], None, "w1", 10) == []  # a waiting job is never claimed
    finish(store, "a", {"text": "A"})
    assert row(pg_dsn, merge)[0] == "waiting"
    finish(store, "b", {"text": "B"})
    assert row(pg_dsn, merge)[0] == "queued"
    (claimed,) = store.claim(["merge"], None, "w1", 1)
    assert claimed.to_job().dependencies == {a: {"text": "A"}, b: {"text": "B"}}


def test_after_a_job_that_does_not_exist_enqueues_nothing(pg_dsn: str) -> None:
    a = enqueue(pg_dsn, "a")
    assert a
    with pytest.raises(EnqueueError, match=rf"after: job {a + 99} does not exist; nothing was enqueued"):
        enqueue_many(pg_dsn, [JobSpec("x"), JobSpec("y", after=(a, a + 99))])
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs")[0][0] == 1
    with pytest.raises(EnqueueError, match="is not a job id"):
        enqueue(pg_dsn, "y", after=["12"])  # type: ignore[list-item]


def test_after_a_done_job_is_queued_at_once_and_after_a_failed_one_is_cancelled(pg_dsn: str, store: PgStore) -> None:
    enqueue(pg_dsn, "a")
    enqueue(pg_dsn, "f")
    a = finish(store, "a", 1)
    f = finish(store, "f", how="failed")
    assert row(pg_dsn, enqueue(pg_dsn, "x", after=[a]) or 0)[0] == "queued"
    assert row(pg_dsn, enqueue(pg_dsn, "y", after=[f]) or 0) == ("cancelled", f"waited on job {f}, which ended failed")


def test_a_failure_cancels_every_job_waiting_behind_it_transitively(pg_dsn: str, store: PgStore) -> None:
    f = enqueue(pg_dsn, "f")
    assert f
    w1 = enqueue(pg_dsn, "w", after=[f])
    assert w1
    w2 = enqueue(pg_dsn, "w", after=[w1])
    other = enqueue(pg_dsn, "o")
    assert w2 and other
    w3 = enqueue(pg_dsn, "w", after=[other])
    finish(store, "f", how="failed")
    assert row(pg_dsn, w1) == ("cancelled", f"waited on job {f}, which ended failed")
    assert row(pg_dsn, w2) == ("cancelled", f"waited on job {w1}, which ended cancelled")
    assert row(pg_dsn, w3 or 0)[0] == "waiting"
    # Retried, the first goes back to waiting on what is not done now.
    assert jobs.retry(pg_dsn, [w1]) == 1 and row(pg_dsn, w1)[0] == "waiting"


def test_cancel_or_delete_of_a_dependency_cancels_its_dependents(pg_dsn: str) -> None:
    a = enqueue(pg_dsn, "a")
    b = enqueue(pg_dsn, "b")
    assert a and b
    wa = enqueue(pg_dsn, "w", after=[a])
    wb = enqueue(pg_dsn, "w", after=[b])
    assert wa and wb
    assert jobs.cancel(pg_dsn, [a]) == 1
    assert row(pg_dsn, wa) == ("cancelled", f"waited on job {a}, which was cancelled")
    assert jobs.delete(pg_dsn, [b]) == 1
    assert row(pg_dsn, wb) == ("cancelled", f"waited on job {b}, which was deleted")
    with pytest.raises(jobs.JobsError, match="a job it waited on was deleted"):  # it stays cancelled
        jobs.retry(pg_dsn, [wb])


def test_follow_ups_land_with_a_done_outcome_once_with_their_edges(pg_dsn: str, store: PgStore) -> None:
    enqueue(pg_dsn, "split")
    parts = [followup("part", payload={"page": i}) for i in range(3)]
    parent = finish(store, "split", {"parts": 3}, followups=[*parts, followup("merge", after=[-1, -2, -3])])
    kinds = query(pg_dsn, "SELECT kind, status FROM shardworker.jobs WHERE id > %s ORDER BY id", parent)
    assert kinds == [("part", "queued")] * 3 + [("merge", "waiting")]
    # The same outcome again (a replay after a lost checkpoint) inserts nothing more.
    (job_id, attempt) = query(pg_dsn, "SELECT id, attempt FROM shardworker.jobs WHERE id = %s", parent)[0]
    blob = orjson.dumps([followup("part")])
    result = store.apply_outcomes([Outcome.done(job_id, attempt, b"1", blob)])
    assert result.replayed == 1 and result.followups == 0
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs")[0][0] == 5
    for _ in range(3):
        finish(store, "part", "p")
    assert query(pg_dsn, "SELECT status FROM shardworker.jobs WHERE kind = 'merge'") == [("queued",)]


def test_follow_ups_of_a_failed_attempt_are_dropped(pg_dsn: str, store: PgStore) -> None:
    (job_id,) = [enqueue(pg_dsn, "split")]
    (job,) = store.claim(["split"], None, "w1", 1)
    failed = Outcome(job.id, job.attempt, Outcome.failed(0, 0, "x").disposition, None, "boom", 0.0,
                     orjson.dumps([followup("part")]))
    store.apply_outcomes([failed])
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs")[0][0] == 1 and job_id


def test_prune_keeps_a_finished_job_while_a_job_depending_on_it_waits(pg_dsn: str, store: PgStore) -> None:
    enqueue(pg_dsn, "a")
    enqueue(pg_dsn, "b")
    a = finish(store, "a", 1)
    b = enqueue(pg_dsn, "b2")
    assert b
    waiting = enqueue(pg_dsn, "w", after=[a, b])
    assert waiting
    query(pg_dsn, "UPDATE shardworker.jobs SET finished_at = now() - interval '30 days' WHERE id = %s RETURNING id", a)
    assert store.prune_batch(86400, 100, ("done", "failed", "cancelled")) == 0
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE id = %s", a)[0][0] == 1


def test_an_enqueue_racing_its_dependencys_outcome_is_released_when_both_commit(pg_dsn: str, store: PgStore) -> None:
    """The enqueue locks the dependency until its commit; the outcome's apply waits for it, then
    sees the new edge (its settling is a statement of its own, after the wait)."""
    d = enqueue(pg_dsn, "d")
    (job,) = store.claim(["d"], None, "w1", 1)
    applying = threading.Thread(target=store.apply_outcomes, args=([Outcome.done(job.id, job.attempt, b"1")],))
    with psycopg.connect(pg_dsn) as conn:
        with conn.transaction():
            waiting = enqueue(conn, "w", after=[d or 0])
            applying.start()
            time.sleep(0.5)
            assert applying.is_alive()  # the apply waits on the enqueue's lock
        applying.join(10)
    assert row(pg_dsn, d or 0)[0] == "done" and row(pg_dsn, waiting or 0)[0] == "queued"


def test_a_dependency_failed_by_a_rescue_cancels_the_jobs_waiting_on_it(pg_dsn: str, store: PgStore) -> None:
    """A peer's rescue at the dependency's last attempt fails it outside the flusher: the jobs
    waiting on it are cancelled, transitively, not left waiting for ever (issue 41, 2)."""
    a = enqueue(pg_dsn, "a", max_attempts=1)
    assert a
    merge = enqueue(pg_dsn, "merge", after=[a])
    last = enqueue(pg_dsn, "last", after=[merge])
    store.claim(["a"], None, "gone", 1)
    store.beat("gone", "host", 1, take_over=True)
    (hb,) = query(pg_dsn, "SELECT heartbeat_at FROM shardworker.workers WHERE worker_id = 'gone'")[0]
    assert store.rescue_workers([("gone", hb)]).jobs == [a]
    assert row(pg_dsn, a)[0] == "failed"
    assert row(pg_dsn, merge) == ("cancelled", f"waited on job {a}, which ended failed")
    assert row(pg_dsn, last)[0] == "cancelled"


def test_a_dependency_failed_by_a_restarts_requeue_cancels_the_jobs_waiting_on_it(pg_dsn: str, store: PgStore) -> None:
    """An orphan requeued at its last attempt (a worker restarted after kill -9) fails: its
    dependents are cancelled."""
    a = enqueue(pg_dsn, "a", max_attempts=1)
    merge = enqueue(pg_dsn, "merge", after=[a])
    store.claim(["a"], None, "w1", 1)
    assert store.requeue_orphans("w1", "worker restarted while the job was running") == [a]
    assert row(pg_dsn, merge)[0] == "cancelled"


def test_a_dependency_failed_by_a_lost_outcome_cancels_the_jobs_waiting_on_it(pg_dsn: str, store: PgStore) -> None:
    """A job requeued because its outcome was lost (a quarantined segment), at its last attempt."""
    a = enqueue(pg_dsn, "a", max_attempts=1)
    merge = enqueue(pg_dsn, "merge", after=[a])
    store.claim(["a"], None, "w1", 1)
    assert store.requeue_lost("w1", "outcome lost", []) == [a]
    assert row(pg_dsn, merge)[0] == "cancelled"


def test_a_fan_in_waits_on_a_shared_follow_up_inserted_in_the_same_batch(pg_dsn: str, store: PgStore) -> None:
    """Two parents' outcomes in one batch each enqueue a follow-up with the same dedupe key and a
    merge after it: the second one's handle is the key's holder, inserted by the same statement,
    and its merge waits on it (it ran before the shared job finished; issue 41, 3)."""
    enqueue_many(pg_dsn, [JobSpec("split", {"n": 1}), JobSpec("split", {"n": 2})])
    one, two = store.claim(["split"], None, "w1", 2)

    def with_shared(job: object, n: int) -> Outcome:
        blob = orjson.dumps([["shared", "null", "default", 0, 25, 0.0, "the-key", []],
                             followup("merge", after=[-1], payload={"n": n})])
        return Outcome.done(job.id, job.attempt, b"1", blob)  # type: ignore[attr-defined]

    store.apply_outcomes([with_shared(one, 1), with_shared(two, 2)])
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE kind = 'shared'") == [(1,)]
    (shared,) = query(pg_dsn, "SELECT id FROM shardworker.jobs WHERE kind = 'shared'")[0]
    merges = query(pg_dsn, "SELECT j.status, array_agg(d.depends_on) FROM shardworker.jobs j "
                           "LEFT JOIN shardworker.job_dependencies d ON d.job_id = j.id "
                           "WHERE j.kind = 'merge' GROUP BY j.id, j.status ORDER BY j.id")
    assert merges == [("waiting", [shared]), ("waiting", [shared])]
    finish(store, "shared", "s")
    assert query(pg_dsn, "SELECT status FROM shardworker.jobs WHERE kind = 'merge'") == [("queued",), ("queued",)]
