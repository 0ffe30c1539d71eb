"""A job's ``errors`` history (migration 0012), written by the fenced apply: one entry per
failed attempt, with its traceback and when it failed, the last 20 kept; an outbox replayed
(a commit whose reply was lost, a checkpoint lost) or a stale attempt adds nothing, and an
outcome in the previous release's record format still lands. Real outbox, real PostgreSQL."""

from __future__ import annotations

import shutil
import struct
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from outbox import OutboxReader, ShardWriter
from shardworker.core import wire
from shardworker.core.model import ClaimedJob, Outcome
from shardworker.flusher.loop import Flusher
from tests.flaky_store import FlakyStore
from tests.flusher.test_flusher_loop import FakeClock
from tests.helpers import enqueue, execute, query, worker_config

AT = 1767225600.5  # 2026-01-01T00:00:00.5Z: when the child says the attempt failed


def errors(dsn: str, job_id: int) -> list[dict[str, Any]]:
    [(found,)] = query(dsn, "SELECT errors FROM shardworker.jobs WHERE id = %s", job_id)
    return list(found)


def claim(store: FlakyStore, n: int = 1) -> list[ClaimedJob]:
    return list(store.claim(["k"], None, "w1", n))


def fail_attempt(job: ClaimedJob, delay_s: float = 0.0) -> Outcome:
    return Outcome.retry(job.id, job.attempt, f"ValueError: attempt {job.attempt}", delay_s,
                         traceback=f"Traceback (most recent call last):\nValueError: attempt {job.attempt}",
                         failed_at=AT + job.attempt)


def write(directory: Path, records: list[bytes]) -> None:
    with ShardWriter.open(str(directory), 0) as writer:
        for record in records:
            writer.append_bytes(record)
        writer.commit()


def flusher(directory: Path, store: FlakyStore) -> Flusher:
    clock = FakeClock()
    return Flusher(OutboxReader.open(str(directory)), store, worker_config().flusher_config(), clock=clock,
                   sleep=clock.sleep)


def test_three_failed_attempts_leave_three_errors_with_tracebacks(pg_dsn: str, store: FlakyStore) -> None:
    [job_id] = enqueue(pg_dsn, "k", 1, max_attempts=3)
    for _ in range(3):
        [job] = claim(store)
        assert store.apply_outcomes([fail_attempt(job)]).applied == 1
    history = errors(pg_dsn, job_id)
    assert [e["attempt"] for e in history] == [1, 2, 3]
    assert [e["error"] for e in history] == [f"ValueError: attempt {n}" for n in (1, 2, 3)]
    assert all(e["traceback"].startswith("Traceback (most recent call last):") for e in history)
    assert datetime.fromisoformat(history[0]["at"]) == datetime.fromtimestamp(AT + 1, UTC)
    [(status, last_error)] = query(pg_dsn, "SELECT status, last_error FROM shardworker.jobs WHERE id = %s", job_id)
    assert status == "failed" and last_error == "ValueError: attempt 3\nTraceback (most recent call last):\n" \
                                                 "ValueError: attempt 3"


def test_a_job_of_25_attempts_keeps_the_last_20(pg_dsn: str, store: FlakyStore) -> None:
    [job_id] = enqueue(pg_dsn, "k", 1, max_attempts=25)
    for _ in range(25):
        [job] = claim(store)
        store.apply_outcomes([fail_attempt(job)])
    assert [e["attempt"] for e in errors(pg_dsn, job_id)] == list(range(6, 26))


def test_only_failed_attempts_are_kept(pg_dsn: str, store: FlakyStore) -> None:
    """Done, snoozed and cancelled outcomes add nothing; an error of the previous format (no
    traceback, no time) gets the time it is applied and a null traceback."""
    ids = enqueue(pg_dsn, "k", 4)
    jobs = claim(store, 4)
    store.apply_outcomes([Outcome.done(jobs[0].id, 1, b"1"), Outcome.snoozed(jobs[1].id, 1, 0.0),
                          Outcome.cancelled(jobs[2].id, 1, "no"), Outcome.retry(jobs[3].id, 1, "old style", 0.0)])
    assert [errors(pg_dsn, i) for i in ids[:3]] == [[], [], []]
    [entry] = errors(pg_dsn, ids[3])
    assert (entry["attempt"], entry["error"], entry["traceback"]) == (1, "old style", None)
    assert abs(datetime.fromisoformat(entry["at"]) - datetime.now(UTC)) < timedelta(minutes=1)


def test_a_replayed_outbox_adds_no_error_twice(pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """The commit's reply is lost, the batch is applied again; then a copy of the outbox taken
    before any checkpoint (what a lost checkpoint leaves) is flushed again: one entry per attempt."""
    ids = enqueue(pg_dsn, "k", 3)
    jobs = claim(store, 3)
    write(tmp_path / "outbox", [wire.encode_outcome(fail_attempt(job, 3600.0)) for job in jobs])
    shutil.copytree(tmp_path / "outbox", tmp_path / "copy")
    first = flusher(tmp_path / "outbox", store)
    store.fail("apply_outcomes", times=1, after=True)
    assert first.run_once() == 0 and first.run_once() == 3
    assert first.stats.replayed == 3
    again = flusher(tmp_path / "copy", store)
    assert again.run_once() == 3 and again.stats.replayed == 3
    assert [len(errors(pg_dsn, i)) for i in ids] == [1, 1, 1]


def test_a_stale_attempt_adds_nothing(pg_dsn: str, store: FlakyStore) -> None:
    """An attempt rescued and claimed again: its late failure is stale, the history unchanged."""
    [job_id] = enqueue(pg_dsn, "k", 1)
    [first] = claim(store)
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'queued', locked_by = NULL WHERE id = %s", job_id)
    [second] = claim(store)
    assert second.attempt == 2
    assert store.apply_outcomes([fail_attempt(first)]).stale == 1
    assert errors(pg_dsn, job_id) == []


def test_an_outbox_of_the_previous_release_drains_into_the_history(pg_dsn: str, store: FlakyStore,
                                                                    tmp_path: Path) -> None:
    """A version-2 failure record, as the release before this one wrote it (traceback inside
    the error text), lands: last_error as it was, one entry with that text."""
    [job_id] = enqueue(pg_dsn, "k", 1)
    [job] = claim(store)
    text = b"ValueError: old\nTraceback (most recent call last):\nValueError: old"
    write(tmp_path, [struct.pack("<BqiBdii", 2, job.id, job.attempt, 0, 5.0, -1, len(text)) + text])
    assert flusher(tmp_path, store).run_once() == 1
    [entry] = errors(pg_dsn, job_id)
    assert (entry["attempt"], entry["error"], entry["traceback"]) == (1, text.decode(), None)
    assert query(pg_dsn, "SELECT last_error FROM shardworker.jobs WHERE id = %s", job_id) == [(text.decode(),)]
