"""Every failure visible where teams look: each failed attempt's error and traceback in the
job's ``errors`` (``jobs show``, text and --json), the worker's log line carrying the
traceback (text) or an ``exc_info`` field (JSON), and ``app.on_failure`` called in the child
for each failed attempt, sync or async, its own exceptions logged and never fatal. Through
the console script in a project directory; handlers and hooks write to a ledger they fsync."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.project_cli import enqueue_in as enqueue
from tests.cli.project_cli import make_project
from tests.cli.project_cli import run_ok as sw

APP = '''
    """Failing handlers, and failure hooks that report to a ledger."""
    import asyncio
    import os

    from shardworker import App, Fail, Snooze

    app = App()


    def ledger(name, line):
        fd = os.open(f"ledger/{name}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{line}\\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)


    @app.on_failure
    def report(job, exc):
        ledger("failures", f"{job.id} {job.attempt} {type(exc).__name__} {exc}")


    async def report_async(job, exc):
        await asyncio.sleep(0)
        ledger("async_failures", f"{job.id} {job.attempt} {type(exc).__name__}")


    def broken_report(job, exc):
        raise RuntimeError("the error tracker is down")


    app.on_failure(report_async)
    app.on_failure(broken_report)


    def fetch_upstream(attempt):
        raise ValueError(f"upstream down on attempt {attempt}")


    @app.handler("flaky", max_attempts=3, retry_delay=lambda attempt: 0.01)
    def flaky(job):
        fetch_upstream(job.attempt)


    @app.handler("stubborn", max_attempts=25, retry_delay=lambda attempt: 0.01)
    def stubborn(job):
        raise RuntimeError(f"still down ({job.attempt})")


    @app.handler("refused")
    async def refused(job):
        raise Fail("bad input")


    @app.handler("sleepy")
    async def sleepy(job):
        if job.attempt == 1:
            raise Snooze(0.01)
        return "ok"
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path, "failures-app", APP)




def run_until_idle(project: Path, dsn: str, *args: str) -> str:
    """Run the worker until nothing is due; its log."""
    return sw(project, dsn, "run", "--app", "tasks", "--outbox-dir", "outbox", "--procs", "1",
              "--exit-when-idle", "--shutdown-timeout", "1", *args).stderr


def ledger(project: Path, name: str) -> list[str]:
    path = project / "ledger" / f"{name}.log"
    return path.read_text().splitlines() if path.exists() else []


def test_three_failed_attempts_show_three_errors_with_tracebacks(project: Path, pg_dsn: str) -> None:
    job_id = enqueue(project, pg_dsn, "flaky")
    log = run_until_idle(project, pg_dsn)
    job = json.loads(sw(project, pg_dsn, "jobs", "show", str(job_id), "--json").stdout)
    assert job["status"] == "failed"
    assert [(e["attempt"], e["error"]) for e in job["errors"]] == [
        (n, f"ValueError: upstream down on attempt {n}") for n in (1, 2, 3)]
    for entry in job["errors"]:
        assert entry["traceback"].startswith("Traceback (most recent call last):")
        assert "in fetch_upstream" in entry["traceback"] and entry["at"].endswith("+00:00")
    text = sw(project, pg_dsn, "jobs", "show", str(job_id)).stdout
    assert "errors: 3" in text and text.count("Traceback (most recent call last):") >= 3
    assert "attempt 2" in text and "ValueError: upstream down on attempt 2" in text
    shown = text.splitlines()
    [at] = [i for i, line in enumerate(shown) if line.lstrip().startswith("last_error:")]
    assert shown[at + 1].startswith(" " * 15), shown[at:at + 3]  # its traceback stays under its key
    # A retried attempt is one log line; the last one carries its traceback, on the lines that follow it.
    lines = log.splitlines()
    for n in (1, 2):
        [at] = [i for i, line in enumerate(lines) if f"job {job_id} (flaky) attempt {n}/3 failed, retrying" in line]
        assert lines[at + 1] != "Traceback (most recent call last):"
    [at] = [i for i, line in enumerate(lines) if f"job {job_id} (flaky) attempt 3/3 failed for good" in line]
    assert lines[at + 1] == "Traceback (most recent call last):" and "in flaky" in lines[at + 2]
    assert "in fetch_upstream" in lines[at + 4]  # from the handler's frame on: none of the worker's own


def test_a_job_of_25_attempts_keeps_its_last_20_errors(project: Path, pg_dsn: str) -> None:
    job_id = enqueue(project, pg_dsn, "stubborn")
    run_until_idle(project, pg_dsn)
    job = json.loads(sw(project, pg_dsn, "jobs", "show", str(job_id), "--json").stdout)
    assert (job["status"], job["attempt"]) == ("failed", 25)
    assert [e["attempt"] for e in job["errors"]] == list(range(6, 26))
    assert job["errors"][-1]["error"] == "RuntimeError: still down (25)"


def test_json_logs_carry_the_traceback_as_exc_info(project: Path, pg_dsn: str) -> None:
    job_id = enqueue(project, pg_dsn, "flaky")
    log = run_until_idle(project, pg_dsn, "--log-format", "json")
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    failed = [line for line in lines if line.get("job_id") == job_id and "failed" in line["message"]]
    assert len(failed) == 3
    assert [("exc_info" in line) for line in failed] == [False, False, True]  # retries: one line each
    assert failed[-1]["exc_info"].startswith("Traceback (most recent call last):")
    assert "Traceback" not in "".join(line["message"] for line in failed)


def test_on_failure_is_called_for_each_failed_attempt_and_its_errors_are_not_fatal(
        project: Path, pg_dsn: str) -> None:
    """A sync and an async hook each see every failed attempt (a Fail included, a Snooze not);
    a hook that raises is logged, and the attempts, the other hooks and the jobs go on."""
    flaky, refused, sleepy = (enqueue(project, pg_dsn, kind) for kind in ("flaky", "refused", "sleepy"))
    log = run_until_idle(project, pg_dsn)
    assert sorted(ledger(project, "failures")) == sorted(
        [f"{flaky} {n} ValueError upstream down on attempt {n}" for n in (1, 2, 3)]
        + [f"{refused} 1 Fail bad input"])
    assert sorted(ledger(project, "async_failures")) == sorted(
        [f"{flaky} {n} ValueError" for n in (1, 2, 3)] + [f"{refused} 1 Fail"])
    assert log.count("on_failure hook tasks.broken_report raised RuntimeError: the error tracker is down") == 4
    statuses = [json.loads(sw(project, pg_dsn, "jobs", "show", str(i), "--json").stdout)["status"]
                for i in (flaky, refused, sleepy)]
    assert statuses == ["failed", "failed", "done"]
