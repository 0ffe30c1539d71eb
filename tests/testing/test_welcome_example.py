"""Testing an app built on shardworker: its handlers run in-process, and what its own code
enqueues, read from a real PostgreSQL (the example of docs/testing.md, run by the suite)."""

from typing import Any

import psycopg

from shardworker import App, Job, Retry, enqueue
from shardworker.testing import record_enqueued, run_handler

app = App()


@app.handler("welcome")
def welcome(job: Job) -> dict[str, str]:
    if job.payload.get("bounced"):
        raise Retry("mailbox full", delay_s=600)
    sent = job.step("send", lambda to: f"sent to {to}", job.payload["to"])  # runs once, ever
    job.enqueue("follow_up", {"to": job.payload["to"]}, delay_s=86400)
    return {"sent": sent}


def sign_up(conn: psycopg.Connection[Any], email: str) -> None:
    """The application's code: the user's row and the welcome mail, in one transaction."""
    with conn.transaction():
        conn.execute("INSERT INTO users (email) VALUES (%s)", (email,))
        enqueue(conn, "welcome", {"to": email})


def test_welcome_sends_and_schedules_a_follow_up() -> None:
    run = run_handler(app, "welcome", {"to": "a@example.com"})
    assert run.result == {"sent": "sent to a@example.com"}
    assert run.steps == {"send": "sent to a@example.com"}
    [follow_up] = run.followups
    assert (follow_up.kind, follow_up.payload, follow_up.delay_s) == ("follow_up", {"to": "a@example.com"}, 86400)


def test_a_later_attempt_does_not_send_again() -> None:
    run = run_handler(app, "welcome", {"to": "a@example.com"}, attempt=2, steps={"send": "sent earlier"})
    assert run.replayed == ["send"] and run.result == {"sent": "sent earlier"}


def test_a_bounce_is_retried_in_ten_minutes() -> None:
    run = run_handler(app, "welcome", {"to": "a@example.com", "bounced": True})
    assert (run.status, run.delay_s) == ("retry", 600)


def test_sign_up_enqueues_the_welcome_mail(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE users (email text PRIMARY KEY)")
        with record_enqueued(pg_dsn) as enqueued:
            sign_up(conn, "b@example.com")
    assert enqueued.one(kind="welcome").payload == {"to": "b@example.com"}
