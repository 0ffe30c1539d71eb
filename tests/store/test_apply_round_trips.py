"""How many round trips a batch of outcomes costs (libpq's trace of what the flusher's
connection sends): one, with its steps, when no job in it has jobs waiting on it and no
outcome carries follow-ups; the outcomes of jobs with dependents then go in a second
transaction that settles those (released, or cancelled), as do batches with follow-ups."""

from __future__ import annotations

from dataclasses import replace

import orjson

from shardworker.client import enqueue
from shardworker.core.model import Outcome, StepRecord
from shardworker.store.pg_store import PgStore
from tests.store.support import add_id, claim_one, done, frontend_messages, frontend_sizes, row


def test_a_batch_with_its_steps_is_one_round_trip(store: PgStore, pg_dsn: str) -> None:
    for _ in range(2):  # connected, and prepared where it is
        add_id(store)
        store.apply_outcomes([done(claim_one(store))])
    jobs = [claim_one(store) for _ in (add_id(store), add_id(store))]
    steps = [StepRecord(jobs[0].id, jobs[0].attempt, "fetch", b"1", 1.0)]
    sent = frontend_messages(store, lambda: store.apply_outcomes([done(j) for j in jobs], steps))
    assert sent.count("Sync") + sent.count("Query") == 1, sent
    assert [row(pg_dsn, j.id)["status"] for j in jobs] == ["done", "done"]


def test_on_a_direct_connection_a_batch_without_steps_is_one_statement(store: PgStore, pg_dsn: str) -> None:
    """No BEGIN, no planner settings for the transaction, no COMMIT: the apply alone, its own
    transaction (the planner settings it needs are the connection's, set at its first batch)."""
    for _ in range(2):
        add_id(store)
        store.apply_outcomes([done(claim_one(store))])
    jobs = [claim_one(store) for _ in (add_id(store), add_id(store))]
    sent = frontend_messages(store, lambda: store.apply_outcomes([done(j) for j in jobs]))
    assert sent.count("Execute") == 1 and sent.count("Sync") == 1, sent
    assert [row(pg_dsn, j.id)["status"] for j in jobs] == ["done", "done"]


def test_a_job_with_a_dependent_is_applied_in_a_second_transaction_that_releases_it(store: PgStore,
                                                                                    pg_dsn: str) -> None:
    add_id(store), add_id(store)
    plain, first = claim_one(store), claim_one(store)
    waiting = enqueue(pg_dsn, "k", after=[first.id])  # while its job runs
    assert waiting is not None and row(pg_dsn, waiting)["status"] == "waiting"
    sent = frontend_messages(store, lambda: store.apply_outcomes([done(plain), done(first)]))
    assert sent.count("Sync") + sent.count("Query") >= 2, sent
    assert [row(pg_dsn, i)["status"] for i in (plain.id, first.id, waiting)] == ["done", "done", "queued"]


def test_a_dependent_enqueued_while_its_job_ran_is_cancelled_when_it_fails(store: PgStore, pg_dsn: str) -> None:
    add_id(store)
    job = claim_one(store)
    waiting = enqueue(pg_dsn, "k", after=[job.id])
    assert waiting is not None
    assert store.apply_outcomes([Outcome.failed(job.id, job.attempt, "boom")]).applied == 1
    assert row(pg_dsn, waiting)["status"] == "cancelled"


def test_a_batch_with_follow_ups_inserts_them_with_their_parents_outcome(store: PgStore, pg_dsn: str) -> None:
    add_id(store)
    job = claim_one(store)
    blob = orjson.dumps([["next", "null", "default", 0, 25, 0.0, None, []]])
    result = store.apply_outcomes([Outcome.done(job.id, job.attempt, b"1", blob)])
    assert (result.applied, result.followups) == (1, 1)
    assert row(pg_dsn, job.id)["status"] == "done"


def test_results_travel_as_the_bytes_the_child_encoded(store: PgStore, pg_dsn: str) -> None:
    """A result goes to PostgreSQL in binary, as encoded: not as text, where bytea doubles in
    hex and costs the flusher an escape pass over it (a 55 MB result took 2.5 s to apply)."""
    for _ in range(2):  # connected, and prepared where it is
        add_id(store)
        store.apply_outcomes([done(claim_one(store))])
    add_id(store)
    job = claim_one(store)
    result = orjson.dumps({"text": "x" * 1_000_000})
    sent = frontend_sizes(store, lambda: store.apply_outcomes([Outcome.done(job.id, job.attempt, result)]))
    bind = max(size for kind, size in sent if kind == "Bind")
    assert len(result) < bind < len(result) + 10_000, sent
    assert row(pg_dsn, job.id)["result"] == {"text": "x" * 1_000_000}


def test_a_traced_retry_keeps_its_run_span_in_the_same_round_trip(store: PgStore, pg_dsn: str) -> None:
    """An outcome whose only extra is its run's span (the application traces: shardworker.core.tracing)
    is applied as any other, one round trip, and its span kept on the row for the next run's
    link; the batch replayed (its reply lost) keeps it once."""
    for _ in range(2):
        add_id(store)
        store.apply_outcomes([done(claim_one(store))])
    job_id = add_id(store, max_attempts=3)
    job = claim_one(store)
    span = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    traced = replace(Outcome.retry(job.id, job.attempt, "boom", 0.0).claimed_by(job),
                     extras_json=orjson.dumps({"trace": span}))
    sent = frontend_messages(store, lambda: store.apply_outcomes([traced]))
    assert sent.count("Sync") + sent.count("Query") == 1, sent
    assert store.apply_outcomes([traced]).replayed == 1
    assert (row(pg_dsn, job_id)["status"], row(pg_dsn, job_id)["trace"]) == ("queued", {"runs": [span]})
