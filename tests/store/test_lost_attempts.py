"""Attempts that never reached an outcome are failed attempts too: the start's requeue of a
worker's orphans, the requeue of jobs whose outcomes a quarantine lost, and a rescue each
add an entry to the job's ``errors`` history (bounded like the apply's: the last 20), not
only ``last_error``."""

from __future__ import annotations

import json
from datetime import datetime

from shardworker.core.limits import ERRORS_KEPT
from shardworker.store.pg_store import PgStore
from tests.store.support import add_id, connect, row


def running(dsn: str, job_id: int, worker: str, attempt: int = 1) -> None:
    with connect(dsn) as conn:
        conn.execute("UPDATE shardworker.jobs SET status = 'running', attempt = %s, locked_by = %s WHERE id = %s",
                     (attempt, worker, job_id))


def test_an_orphan_requeued_at_start_keeps_its_lost_attempt(store: PgStore, pg_dsn: str) -> None:
    job_id = add_id(store)
    running(pg_dsn, job_id, "w1")
    assert store.requeue_orphans("w1", "worker restarted while the job was running") == [job_id]
    [entry] = row(pg_dsn, job_id)["errors"]
    assert (entry["attempt"], entry["error"], entry["traceback"]) == (
        1, "worker restarted while the job was running", None)
    assert datetime.fromisoformat(entry["at"]).tzinfo is not None


def test_a_job_whose_outcome_a_quarantine_lost_keeps_its_lost_attempt(store: PgStore, pg_dsn: str) -> None:
    kept, lost = add_id(store), add_id(store)
    running(pg_dsn, kept, "w1")
    running(pg_dsn, lost, "w1", attempt=3)
    assert store.requeue_lost("w1", "outcome lost: segment 7 quarantined", [kept]) == [lost]
    assert [(e["attempt"], e["error"]) for e in row(pg_dsn, lost)["errors"]] == [
        (3, "outcome lost: segment 7 quarantined")]
    assert row(pg_dsn, kept)["errors"] == []


def test_a_rescued_attempt_is_in_the_history_which_keeps_its_last_twenty(store: PgStore, pg_dsn: str) -> None:
    job_id = add_id(store)
    history = [{"attempt": n, "at": "2026-01-01T00:00:00+00:00", "error": f"e{n}", "traceback": None}
               for n in range(1, ERRORS_KEPT + 1)]
    with connect(pg_dsn) as conn:
        conn.execute("UPDATE shardworker.jobs SET errors = %s::jsonb, max_attempts = 99 WHERE id = %s",
                     (json.dumps(history), job_id))
        conn.execute("INSERT INTO shardworker.workers (worker_id, hostname, pid, heartbeat_at) "
                     "VALUES ('gone', 'h', 1, now() - interval '1 hour')")
        [(beat,)] = conn.execute("SELECT heartbeat_at FROM shardworker.workers WHERE worker_id = 'gone'").fetchall()
    running(pg_dsn, job_id, "gone", attempt=ERRORS_KEPT + 1)
    assert store.rescue_workers([("gone", beat)]) == (("gone",), [job_id])
    errors = row(pg_dsn, job_id)["errors"]
    assert len(errors) == ERRORS_KEPT and errors[0]["attempt"] == 2
    assert (errors[-1]["attempt"], errors[-1]["error"]) == (
        ERRORS_KEPT + 1, "rescued: worker gone stopped heartbeating")
