"""One ``max_attempts``: what a handler's ``max_attempts=`` and its snoozes make of a job's
row, seen as a user sees them (``jobs list``, ``jobs show``, the worker's log), through the
console script in a project directory. Handlers count their runs in a ledger they fsync."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.project_cli import enqueue_in as enqueue
from tests.cli.project_cli import make_project
from tests.cli.project_cli import run_ok as sw

APP = '''
    """Handlers with their own max_attempts, and handlers that snooze."""
    import os

    from shardworker import App, Snooze

    app = App()


    def ledger(job):
        fd = os.open("ledger/runs.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{job.id} {job.attempt}\\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)


    @app.handler("flaky", max_attempts=4, retry_delay=lambda attempt: 3600)
    def flaky(job):
        ledger(job)
        raise ValueError("upstream down")


    @app.handler("patient", max_attempts=2, retry_delay=lambda attempt: 0.05)
    def patient(job):
        ledger(job)
        if job.attempt == 1:
            raise Snooze(0.05)
        raise ValueError(f"still down on run {job.attempt}")


    @app.handler("waits_once")
    def waits_once(job):
        ledger(job)
        if job.attempt == 1:
            raise Snooze(0.05)
        return {"attempt": job.attempt, "max_attempts": job.max_attempts, "snoozes": job.snoozes}
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path, "attempts-app", APP)




def run_until_idle(project: Path, dsn: str) -> str:
    """Run the worker until nothing is due (a retry an hour away is not); its log."""
    return sw(project, dsn, "run", "--app", "tasks", "--outbox-dir", "outbox", "--procs", "1",
              "--exit-when-idle", "--shutdown-timeout", "1").stderr


def listed(project: Path, dsn: str, job_id: int) -> str:
    """The line of ``jobs list`` that shows ``job_id``."""
    lines = sw(project, dsn, "jobs", "list").stdout.splitlines()
    [line] = [line for line in lines if line.split()[:1] == [str(job_id)]]
    return line


def shown(project: Path, dsn: str, job_id: int) -> dict[str, object]:
    return dict(json.loads(sw(project, dsn, "jobs", "show", str(job_id), "--json").stdout))


def runs(project: Path) -> list[str]:
    return (project / "ledger" / "runs.log").read_text().splitlines()


def test_the_handlers_max_attempts_is_the_rows_from_the_first_claim_on(project: Path, pg_dsn: str) -> None:
    """Enqueued with the default 25 attempts, a job whose handler says max_attempts=4 reads 1/4
    after its first failed attempt (its retry an hour away): in jobs list, jobs show and the log."""
    job_id = enqueue(project, pg_dsn, "flaky")
    log = run_until_idle(project, pg_dsn)
    assert f"job {job_id} (flaky) attempt 1/4 failed, retrying" in log
    job = shown(project, pg_dsn, job_id)
    assert (job["status"], job["attempt"], job["max_attempts"], job["snoozes"]) == ("queued", 1, 4, 0)
    assert " 1/4 " in listed(project, pg_dsn, job_id)
    assert runs(project) == [f"{job_id} 1"]


def test_a_snooze_uses_no_attempt_of_the_handlers_max_attempts(project: Path, pg_dsn: str) -> None:
    """max_attempts=2, snoozed on its first run: it fails twice more (three runs) and ends
    failed at 2/2 with one snooze, max_attempts untouched."""
    job_id = enqueue(project, pg_dsn, "patient")
    log = run_until_idle(project, pg_dsn)
    assert runs(project) == [f"{job_id} 1", f"{job_id} 2", f"{job_id} 3"]
    assert f"job {job_id} (patient) attempt 1/2 failed, retrying" in log
    assert f"job {job_id} (patient) attempt 2/2 failed for good" in log
    job = shown(project, pg_dsn, job_id)
    assert (job["status"], job["attempt"], job["max_attempts"], job["snoozes"]) == ("failed", 3, 2, 1)
    assert " 2/2 +1 snoozed " in listed(project, pg_dsn, job_id)


def test_a_snoozed_job_keeps_its_max_attempts(project: Path, pg_dsn: str) -> None:
    """A job snoozed once and then done reads 1/25 with one snooze, never 2/26; its handler saw
    attempt 2, max_attempts 25 and snoozes 1."""
    job_id = enqueue(project, pg_dsn, "waits_once")
    run_until_idle(project, pg_dsn)
    job = shown(project, pg_dsn, job_id)
    assert (job["status"], job["attempt"], job["max_attempts"], job["snoozes"]) == ("done", 2, 25, 1)
    assert job["result"] == {"attempt": 2, "max_attempts": 25, "snoozes": 1}
    line = listed(project, pg_dsn, job_id)
    assert " 1/25 +1 snoozed " in line and "/26" not in line
