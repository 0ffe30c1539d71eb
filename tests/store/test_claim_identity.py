"""The fence after the database went back in time (a failover to a replica that lagged, a
restore): an outcome lands on the claim that ran it, of the job that ran it, and on the row
as that claim found it when the claim itself was lost. The database's going back is played
here by writing a row back to what it was before the claim (the replica's copy); the real
failover is in tests/faults/test_database_regression.py."""

from __future__ import annotations

from typing import Any

from shardworker.core.model import ClaimedJob, Outcome, StepRecord
from shardworker.store.pg_store import PgStore
from tests.helpers import query
from tests.store.support import add_id, claim_one, connect, row


def _as_before_the_claim(dsn: str, job_id: int) -> None:
    """What a replica that lagged holds of a job claimed after it stopped: queued, never claimed."""
    with connect(dsn) as conn:
        conn.execute("UPDATE shardworker.jobs SET status = 'queued', attempt = 0, locked_by = NULL, "
                     "claim_token = NULL, attempted_at = NULL WHERE id = %s", (job_id,))


def _done(job: ClaimedJob, result: str = '{"ran": "here"}') -> Outcome:
    return Outcome.done(job.id, job.attempt, result.encode()).claimed_by(job)


def test_a_claim_carries_the_jobs_uid_and_its_token(store: PgStore, pg_dsn: str) -> None:
    """The claimed job knows the row's uid and the claim's token, which its outcomes carry."""
    job_id = add_id(store)
    job = store.claim(["k"], None, "w1", 1, "a" * 32)[0]
    assert (job.id, job.token, job.uid) == (job_id, "a" * 32, row(pg_dsn, job_id)["uid"])
    assert job.uid is not None


def test_an_outcome_never_lands_on_another_workers_claim_of_the_same_attempt(store: PgStore, other: PgStore,
                                                                               pg_dsn: str) -> None:
    """The database lost W's claim; V claimed the job again, at the same attempt number: W's
    outcome is stale, and V's claim stays as it is (its own outcome lands)."""
    job_id = add_id(store)
    ours = store.claim(["k"], None, "w", 1, "a" * 32)[0]
    _as_before_the_claim(pg_dsn, job_id)
    theirs = other.claim(["k"], None, "v", 1, "b" * 32)[0]
    assert theirs.attempt == ours.attempt == 1
    result = store.apply_outcomes([_done(ours)])
    assert (result.applied, result.stale) == (0, 1)
    assert (row(pg_dsn, job_id)["status"], row(pg_dsn, job_id)["locked_by"]) == ("running", "v")
    assert other.apply_outcomes([_done(theirs, '{"ran": "there"}')]).applied == 1
    assert row(pg_dsn, job_id)["result"] == {"ran": "there"}


def test_an_outcome_lands_on_the_row_its_lost_claim_found(store: PgStore, pg_dsn: str) -> None:
    """The database went back to before the claim: the row is queued at attempt 0, and the
    outcome of attempt 1 that ran lands (instead of the job running again)."""
    job_id = add_id(store, max_attempts=3)
    job = claim_one(store)
    _as_before_the_claim(pg_dsn, job_id)
    assert store.apply_outcomes([_done(job)]).applied == 1
    r = row(pg_dsn, job_id)
    assert (r["status"], r["attempt"], r["result"], r["applied_attempt"]) == ("done", 1, {"ran": "here"}, 1)
    assert store.claim(["k"], None, "w1", 10) == []


def test_a_retry_lands_on_the_row_its_lost_claim_found_and_counts_the_attempt(store: PgStore, pg_dsn: str) -> None:
    """A failed attempt whose claim was lost is charged as it would have been: attempt 1 of 3 used."""
    job_id = add_id(store, max_attempts=3)
    job = claim_one(store)
    _as_before_the_claim(pg_dsn, job_id)
    failed = Outcome.retry(job.id, job.attempt, "boom", 0.0).claimed_by(job)
    assert store.apply_outcomes([failed]).applied == 1
    r = row(pg_dsn, job_id)
    assert (r["status"], r["attempt"], r["applied_attempt"]) == ("queued", 1, 1)
    assert claim_one(store).attempt == 2


def test_a_replayed_outcome_does_not_land_twice_on_a_row_queued_again(store: PgStore, pg_dsn: str) -> None:
    """A retry applied once queues the job at its attempt; the same outcome replayed is a replay,
    not a claim lost (applied_attempt says it landed)."""
    add_id(store, max_attempts=3)
    job = claim_one(store)
    failed = Outcome.retry(job.id, job.attempt, "boom", 0.0).claimed_by(job)
    assert store.apply_outcomes([failed]).applied == 1
    again = store.apply_outcomes([failed])
    assert (again.applied, again.replayed) == (0, 1)
    assert row(pg_dsn, job.id)["attempt"] == 1


def test_an_outcome_never_lands_on_another_job_that_got_its_id(store: PgStore, pg_dsn: str) -> None:
    """The database lost the job's insert and handed its id to another job: the outcome is of a
    job that does not exist here (set aside), and the other job runs as its own."""
    job_id = add_id(store)
    job = claim_one(store)
    with connect(pg_dsn) as conn:
        conn.execute("DELETE FROM shardworker.jobs WHERE id = %s", (job_id,))
        conn.execute("INSERT INTO shardworker.jobs (id, kind, payload) VALUES (%s, 'k', '{\"another\": 1}')",
                     (job_id,))
    result = store.apply_outcomes([_done(job)])
    assert (result.applied, result.missing_ids) == (0, (job_id,))
    assert (row(pg_dsn, job_id)["status"], row(pg_dsn, job_id)["result"]) == ("queued", None)


def test_a_step_never_lands_on_another_job_that_got_its_id(store: PgStore, pg_dsn: str) -> None:
    """A kept step of the job whose id went to another job is not that job's step."""
    job_id = add_id(store)
    job = claim_one(store)
    with connect(pg_dsn) as conn:
        conn.execute("DELETE FROM shardworker.jobs WHERE id = %s", (job_id,))
        conn.execute("INSERT INTO shardworker.jobs (id, kind) VALUES (%s, 'k')", (job_id,))
    step = StepRecord(job.id, job.attempt, "fetch", b'"theirs"', 1.0, job.uid)
    assert store.apply_outcomes([], [step]).steps == 0
    assert _steps(pg_dsn, job_id) == []


def test_a_step_of_the_same_job_lands_after_the_database_went_back(store: PgStore, pg_dsn: str) -> None:
    """The uid matches: the kept step lands, its claim lost or not."""
    job_id = add_id(store)
    job = claim_one(store)
    _as_before_the_claim(pg_dsn, job_id)
    assert store.apply_outcomes([], [StepRecord(job.id, job.attempt, "fetch", b'"ok"', 1.0, job.uid)]).steps == 1
    assert _steps(pg_dsn, job_id) == [("fetch", "ok")]


def _steps(dsn: str, job_id: int) -> list[tuple[str, Any]]:
    with connect(dsn) as conn:
        return [(n, r) for n, r in conn.execute(
            "SELECT name, result FROM shardworker.job_steps WHERE job_id = %s ORDER BY name", (job_id,))]


def test_a_later_attempts_outcome_lands_first_on_a_row_that_went_back_two_attempts(store: PgStore,
                                                                                 pg_dsn: str) -> None:
    """Re-applied after the database went back to before both claims, a job's attempt 2 (done)
    may come before its attempt 1 (a retry): read from another shard, or another worker's
    outbox. It lands (its run proves attempt 1 ended), and attempt 1's outcome is then stale
    (it left the job queued to run a third time)."""
    job_id = add_id(store, max_attempts=3)
    first = claim_one(store)
    retried = Outcome.retry(first.id, first.attempt, "boom", 0.0).claimed_by(first)
    assert store.apply_outcomes([retried]).applied == 1
    second = claim_one(store)
    _as_before_the_claim(pg_dsn, job_id)
    assert store.apply_outcomes([_done(second)]).applied == 1
    again = store.apply_outcomes([retried])
    assert (again.applied, again.stale) == (0, 1)
    r = row(pg_dsn, job_id)
    assert (r["status"], r["attempt"], r["result"]) == ("done", 2, {"ran": "here"})


def test_a_later_attempts_outcome_lands_on_a_row_still_running_an_older_attempt(store: PgStore, pg_dsn: str) -> None:
    """The database went back to while attempt 1 ran: the row says running at 1. Attempt 2's
    outcome lands: its run proves attempt 1 ended and a second claim ran."""
    job_id = add_id(store, max_attempts=3)
    first = claim_one(store)
    with connect(pg_dsn) as conn:
        then = conn.execute("SELECT status, attempt, locked_by, claim_token FROM shardworker.jobs WHERE id = %s",
                            (job_id,)).fetchone()
    store.apply_outcomes([Outcome.retry(first.id, first.attempt, "boom", 0.0).claimed_by(first)])
    second = claim_one(store)
    with connect(pg_dsn) as conn:
        conn.execute("UPDATE shardworker.jobs SET status = %s, attempt = %s, locked_by = %s, claim_token = %s, "
                     "applied_attempt = NULL WHERE id = %s", (*then, job_id))
    assert store.apply_outcomes([_done(second)]).applied == 1
    assert (row(pg_dsn, job_id)["status"], row(pg_dsn, job_id)["attempt"]) == ("done", 2)


def test_steps_of_a_lost_claim_reach_the_next_claim_of_the_same_attempt_number(store: PgStore, pg_dsn: str) -> None:
    """The database lost a claim whose steps land again from the kept tail: the job, queued at
    attempt 0, is claimed as attempt 1 again, and that claim gets the steps (the claim read
    steps only after the first attempt, and the steps ran again: found by a trial, kill -9
    and a failover)."""
    job_id = add_id(store)
    job = claim_one(store)
    _as_before_the_claim(pg_dsn, job_id)
    store.apply_outcomes([], [StepRecord(job.id, job.attempt, "fetch", b'"page"', 1.0, job.uid)])
    again = claim_one(store)
    assert again.attempt == 1 and again.steps_json is not None and "fetch" in again.steps_json


def test_follow_ups_inserted_again_keep_their_ids_and_later_inserts_draw_past_them(store: PgStore,
                                                                                  pg_dsn: str) -> None:
    """The database went back to before a parent's outcome and its follow-ups: applied again
    with the ids they had (the journal's), they get those ids and their uids, and the id
    sequence, which went back too, is drawn past them, so no later enqueue collides."""
    from dataclasses import replace

    import orjson

    add_id(store)
    parent = store.claim(["k"], None, "w1", 1, "a" * 32)[0]
    blob = orjson.dumps([["part", "null", "default", 0, 25, 0.0, None, []] for _ in range(3)])
    done = Outcome.done(parent.id, parent.attempt, b"1", blob).claimed_by(parent)
    first = store.apply_outcomes([done])
    ((_, _, ids),) = first.followup_ids
    uids = [row(pg_dsn, i)["uid"] for i in ids]
    with connect(pg_dsn) as conn:
        conn.execute("DELETE FROM shardworker.jobs WHERE id <> %s", (parent.id,))
        conn.execute("UPDATE shardworker.jobs SET status = 'running', result = NULL, applied_attempt = NULL, "
                     "finished_at = NULL WHERE id = %s", (parent.id,))
        conn.execute("SELECT setval(pg_get_serial_sequence('shardworker.jobs', 'id'), %s)", (parent.id,))
    again = store.apply_outcomes([replace(done, reapplied=True, followup_ids=ids, followup_wait_s=30.0)])
    assert again.followup_ids == ((parent.id, parent.attempt, ids),)
    assert [row(pg_dsn, i)["uid"] for i in ids] == uids
    assert all(row(pg_dsn, i)["due_in_s"] > 20 and row(pg_dsn, i)["reinserted"] for i in ids)  # they wait
    assert add_id(store) > max(i for i in ids if i is not None)


def test_an_outcome_finds_its_follow_up_inserted_again_under_another_id(store: PgStore, pg_dsn: str) -> None:
    """The database went back, and the follow-up's id went to another job before its parent's
    outcome was applied again: the follow-up gets a new id, and its own outcome, which names the
    old one, lands there all the same (by its uid), not on the other job."""
    from dataclasses import replace

    import orjson

    add_id(store)
    parent = store.claim(["k"], None, "w1", 1, "a" * 32)[0]
    blob = orjson.dumps([["part", "null", "default", 0, 25, 0.0, None, []]])
    done = Outcome.done(parent.id, parent.attempt, b"1", blob).claimed_by(parent)
    ((_, _, (part_id,)),) = store.apply_outcomes([done]).followup_ids
    part = store.claim(["part"], None, "w1", 1, "b" * 32)[0]
    with connect(pg_dsn) as conn:
        conn.execute("DELETE FROM shardworker.jobs WHERE id <> %s", (parent.id,))
        conn.execute("UPDATE shardworker.jobs SET status = 'running', result = NULL, applied_attempt = NULL, "
                     "finished_at = NULL WHERE id = %s", (parent.id,))
        conn.execute("INSERT INTO shardworker.jobs (id, kind) VALUES (%s, 'another')", (part_id,))
    store.apply_outcomes([replace(done, reapplied=True, followup_ids=(part_id,))])
    (new_id,) = [i for (i,) in query(pg_dsn, "SELECT id FROM shardworker.jobs WHERE kind = 'part'")]
    assert new_id != part_id
    result = store.apply_outcomes([Outcome.done(part.id, part.attempt, b'"theirs"').claimed_by(part)])
    assert (result.applied, result.missing_ids) == (1, ())
    assert (row(pg_dsn, new_id)["status"], row(pg_dsn, new_id)["result"]) == ("done", "theirs")
    assert row(pg_dsn, part_id)["status"] == "queued"  # the other job, untouched
