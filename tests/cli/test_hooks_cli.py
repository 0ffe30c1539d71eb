"""Set up once per process: ``@app.on_startup`` and ``@app.on_shutdown`` hooks, sync or async,
run in each child (async ones on the child's event loop, where async handlers run) before its
first job and after its last; handlers reach what startup made through ``app.state``; a
startup hook that raises stops the worker at start with one line naming it, and leaves no job
running or charged. Through the console script in a project directory."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cli.project_cli import make_project, run_in
from tests.helpers import query

APP = '''
    """One shared client per child, made by startup hooks and closed by shutdown hooks."""
    import asyncio
    import os

    from shardworker import App

    app = App()


    def ledger(line):
        fd = os.open("ledger/hooks.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{os.getpid()} {line}\\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)


    class Client:
        """Stands for an HTTP client: bound to the loop it was made on."""
        def __init__(self):
            self.loop = asyncio.get_running_loop()
            self.calls = 0


    @app.on_startup
    def open_pool():
        app.state.pool = ["connection"]
        ledger("startup sync")


    @app.on_startup
    async def open_client():
        app.state.client = Client()
        ledger("startup async")


    @app.on_shutdown
    async def close_client():
        ledger(f"shutdown async {app.state.client.calls}")


    @app.on_shutdown
    def close_pool():
        ledger("shutdown sync")


    @app.handler("fetch")
    async def fetch(job):
        client = app.state.client
        client.calls += 1
        return {"same_loop": client.loop is asyncio.get_running_loop(), "pid": os.getpid(),
                "client": id(client)}


    @app.handler("query")
    def query(job):
        return {"pool": app.state.pool, "pid": os.getpid()}
'''

BROKEN = '''
    """A startup hook that cannot reach what it needs."""
    from shardworker import App

    app = App()


    @app.on_startup
    async def connect_upstream():
        raise ConnectionRefusedError("upstream.internal:443 refused the connection")


    @app.handler("fetch")
    def fetch(job):
        return "never"
'''


def sw(project: Path, dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    done = run_in(project, dsn, *args)
    assert done.returncode == 0, (args, done.stdout, done.stderr[-3000:])
    return done


def run(project: Path, dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_in(project, dsn, "run", "--app", "tasks", "--outbox-dir", "outbox", "--exit-when-idle",
                  "--shutdown-timeout", "2", *args)


def test_hooks_run_once_per_child_and_handlers_share_what_startup_made(tmp_path: Path, pg_dsn: str) -> None:
    project = make_project(tmp_path, "hooks-app", APP)
    sw(project, pg_dsn, "enqueue", "fetch", "--count", "20")
    sw(project, pg_dsn, "enqueue", "query", "--count", "4")
    done = run(project, pg_dsn, "--procs", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line.split(" ", 1) for line in (project / "ledger" / "hooks.log").read_text().splitlines()]
    by_pid: dict[str, list[str]] = {}
    for pid, what in lines:
        by_pid.setdefault(pid, []).append(what)
    assert len(by_pid) == 2  # each child, once: startup in order, then shutdown in order
    for events in by_pid.values():
        assert events[:2] == ["startup sync", "startup async"] and events[3] == "shutdown sync"
        assert events[2].startswith("shutdown async ")
    assert sum(int(events[2].split()[-1]) for events in by_pid.values()) == 20
    results = [r for (r,) in query(pg_dsn, "SELECT result FROM shardworker.jobs WHERE kind = 'fetch'")]
    assert all(r["same_loop"] for r in results) and len({r["client"] for r in results}) <= 2
    assert {str(r["pid"]) for r in results} <= set(by_pid)
    pools = [r for (r,) in query(pg_dsn, "SELECT result FROM shardworker.jobs WHERE kind = 'query'")]
    assert all(r["pool"] == ["connection"] for r in pools)


def test_a_startup_hook_that_raises_stops_the_worker_at_start_in_one_line(tmp_path: Path, pg_dsn: str) -> None:
    """Exit 1; the last line names the hook and its error; no traceback; every job queued, none charged."""
    project = make_project(tmp_path, "broken-app", BROKEN)
    sw(project, pg_dsn, "enqueue", "fetch", "--count", "10")
    done = run(project, pg_dsn, "--procs", "2")
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: child ") and "could not start" in last, last
    assert "on_startup hook tasks.connect_upstream raised ConnectionRefusedError: upstream.internal:443 " \
           "refused the connection" in last, last
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("connect_upstream") == 1, done.stderr
    assert query(pg_dsn, "SELECT status, attempt, count(*) FROM shardworker.jobs GROUP BY 1, 2") == [("queued", 0, 10)]


@pytest.mark.parametrize("hook", ["on_startup", "on_shutdown", "on_failure"])
def test_a_hook_that_is_not_a_function_is_refused_at_load(tmp_path: Path, pg_dsn: str, hook: str) -> None:
    project = make_project(tmp_path, f"bad-{hook}", f'''
        from shardworker import App

        app = App()
        app.{hook}("not a function")
    ''')
    done = run(project, pg_dsn, "--procs", "1")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(f"app.{hook} takes a function, not a str")


