"""The worker run as a user runs it: the installed ``shardworker`` script, from a project
directory that holds its own folders (one named ``outbox/``, one named ``shardworker/``),
its app module, and relative paths."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import enqueue, query

APP = '''
    """The project's tasks: each run is appended to a ledger and fsync'd."""
    import os

    from shardworker import App

    app = App()


    @app.handler("note")
    def note(job):
        fd = os.open("ledger/runs.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{job.id} {job.attempt}\\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return {"id": job.id}
'''


def shardworker_script() -> list[str]:
    exe = shutil.which("shardworker") or os.path.join(os.path.dirname(sys.executable), "shardworker")
    if not os.path.exists(exe):
        pytest.skip("the shardworker console script is not installed (pip install -e .)")
    return [exe]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project directory: tasks.py, a ledger folder, and folders named like shardworker's packages."""
    root = tmp_path / "myproject"
    (root / "ledger").mkdir(parents=True)
    (root / "outbox").mkdir()  # the outbox directory the user chose, beside the code
    (root / "shardworker").mkdir()  # say, the project's deployment notes
    (root / "shardworker" / "notes.txt").write_text("how we deploy\n")
    (root / "tasks.py").write_text(textwrap.dedent(APP).lstrip())
    return root


def run_worker(project: Path, dsn: str, *args: str, timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SHARDWORKER_DSN")}
    return subprocess.run([*shardworker_script(), "run", "--app", "tasks", "--outbox-dir", "outbox", "--dsn", dsn,
                           *args], cwd=project, env=env, capture_output=True, text=True, timeout=timeout_s)


def test_worker_runs_from_a_project_with_folders_named_like_its_packages(project: Path, pg_dsn: str) -> None:
    """With outbox/ and shardworker/ folders in the working directory, every process imports the
    installed packages, tasks.py still loads from the working directory, and each job runs once."""
    ids = enqueue(pg_dsn, "note", 50)
    result = run_worker(project, pg_dsn, "--procs", "2", "--exit-when-idle")
    assert result.returncode == 0, result.stderr[-3000:]
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE status = 'done'") == [(50,)]
    runs = (project / "ledger" / "runs.log").read_text().split("\n")
    assert sorted(int(line.split()[0]) for line in runs if line) == ids
    assert any(name.endswith(".seg") or name == "checkpoint.json" for name in os.listdir(project / "outbox"))
    assert (project / "shardworker" / "notes.txt").read_text() == "how we deploy\n"


OPERATED_APP = '''
    """A project with a failing kind and a yearly schedule, for an operator's session."""
    import os

    from shardworker import App, Fail

    app = App()
    app.periodic("0 0 1 1 *", kind="note", payload={"yearly": True}, name="new-year")


    @app.handler("note")
    def note(job):
        fd = os.open("ledger/runs.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{job.id} {job.attempt}\\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        if job.payload.get("fail") and not os.path.exists("fixed"):
            raise Fail("bad input")
        return {"id": job.id}
'''


def console(project: Path, dsn: str, env: dict[str, str]) -> Callable[..., str]:
    """``sw(*args, code=0)``: the console script run from ``project``; its stdout, or its stderr
    when the expected exit code is not 0. Never a traceback."""

    def sw(*args: str, code: int = 0) -> str:
        done = subprocess.run([*shardworker_script(), *args, "--dsn", dsn], cwd=project, env=env,
                              capture_output=True, text=True, timeout=90)
        assert done.returncode == code, (args, done.stdout, done.stderr[-3000:])
        assert "Traceback" not in done.stderr
        return done.stdout if code == 0 else done.stderr

    return sw


def test_an_operators_session_through_the_console_script(project: Path, pg_dsn: str) -> None:
    """Every operator command run as a user runs it, from the project directory: the schema
    printed, jobs enqueued and run, the failed one found, retried after the fix and run once
    more, a live and a finished worker listed, the schedule seen, a job deleted, old jobs pruned."""
    (project / "tasks.py").write_text(textwrap.dedent(OPERATED_APP).lstrip())
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SHARDWORKER_DSN")}
    sw = console(project, pg_dsn, env)
    assert "CREATE TABLE shardworker.jobs" in sw("migrate", "--print")
    assert sw("enqueue", "note", '{"n": 1}', "--count", "4") == "enqueued 4 jobs: 1, 2, 3, 4\n"
    assert sw("enqueue", "note", '{"fail": true}') == "enqueued 1 job: 5\n"
    run = ("run", "--app", "tasks", "--outbox-dir", "outbox", "--procs", "2", "--exit-when-idle")
    sw(*run)

    failed = json.loads(sw("jobs", "list", "--status", "failed", "--json"))
    assert [(j["payload"], j["last_error"]) for j in failed] == [({"fail": True}, "Fail: bad input")]
    failing = failed[0]["id"]
    assert json.loads(sw("jobs", "show", str(failing), "--json"))["attempt"] == 1
    (project / "fixed").touch()
    assert json.loads(sw("jobs", "retry", "--failed", "--kind", "note", "--json")) == {"retry": 1}
    worker = subprocess.Popen([*shardworker_script(), *run[:-1], "--dsn", pg_dsn], cwd=project, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert json.loads(sw("jobs", "wait", str(failing), "--timeout", "60", "--json"))["status"] == "done"
        [live] = json.loads(sw("workers", "--json"))
        assert (live["pid"], live["hostname"]) == (worker.pid, socket.gethostname())
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.stderr.read().decode()[-3000:] if worker.stderr else ""
    ledger = (project / "ledger" / "runs.log").read_text().split()
    assert ledger.count(str(failing)) == 2 and len(ledger) == 2 * 6  # the retried job twice, the rest once

    assert sw("jobs", "cancel", str(failing), code=1) == (
        f"error: cannot cancel job {failing}: it is done; only queued, waiting or running jobs can be cancelled; "
        "nothing changed\n")
    stats = json.loads(sw("stats", "--exact", "--json"))
    assert stats["total"] == {"waiting": 0, "queued": 0, "running": 0, "done": 5, "failed": 0, "cancelled": 0,
                              "available": 0, "scheduled": 0, "prefetched": 0, "started": 0}
    [schedule] = json.loads(sw("periodic", "--json"))
    assert (schedule["name"], schedule["schedule"]) == ("new-year", "0 0 1 1 *")
    assert json.loads(sw("workers", "--all", "--json")) == []  # a worker that stops says so
    refused = sw("prune", "--older-than", "7x", code=2)
    assert "Error: Invalid value for '--older-than': '7x' is not a duration" in refused
    assert sw("enqueue", "note", '{"n": 2}', "--delay", "3600").startswith("enqueued 1 job: ")
    [later] = json.loads(sw("jobs", "list", "--status", "queued", "--json"))
    assert sw("jobs", "delete", str(later["id"])) == "1 job deleted\n"
    assert "0 would delete every finished job" in sw("prune", "--older-than", "0", code=2)
    time.sleep(1.0)
    assert json.loads(sw("prune", "--older-than", "1s", "--json")) == {"pruned": 5}
    assert sw("jobs", "show", str(failing), code=1) == f"error: no job {failing}\n"
