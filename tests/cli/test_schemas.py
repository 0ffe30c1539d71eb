"""Several apps on one database, each in a schema of its own (issue 45, 6), through the console
script: ``migrate --schema`` creates each; each app's worker runs its own jobs only, counted
from inside the handlers; a cancel, a pause, the workers list and the stats of one never reach
the other, though both use the same job ids, kinds and queue names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardworker import enqueue, get_job, using_schema
from shardworker.errors import ConfigError
from tests.helpers import exit_code, query, runs_per_job, start_worker, wait_for, worker_env


def sw(dsn: str, *args: str, schema: str | None = None, code: int = 0, cwd: Path | None = None) -> str:
    env = worker_env(cwd or Path.cwd())
    if schema is not None:
        env["SHARDWORKER_SCHEMA"] = schema
    done = subprocess.run([sys.executable, "-m", "shardworker", *args, "--dsn", dsn], capture_output=True, text=True,
                          env=env, timeout=120, cwd=cwd)
    assert done.returncode == code, done.stderr
    return done.stdout if code == 0 else done.stderr


def statuses(dsn: str, schema: str) -> dict[int, str]:
    return dict(query(dsn, f"SELECT id, status FROM {schema}.jobs"))


def test_two_apps_on_one_database_never_see_each_other(empty_dsn: str, tmp_path: Path) -> None:
    dsn = empty_dsn
    sw(dsn, "migrate", "--schema", "app_a")
    sw(dsn, "migrate", schema="app_b")  # the environment names it as well
    a_ids = [enqueue(dsn, "count", {"app": "a", "n": n}, schema="app_a") for n in range(20)]
    with using_schema("app_b"):
        b_ids = [enqueue(dsn, "count", {"app": "b", "n": n}) for n in range(20)]
        slow_b = enqueue(dsn, "slow", {"sleep": 0.1})
    slow_a = enqueue(dsn, "slow", {"sleep": 4}, schema="app_a")
    assert a_ids == b_ids == list(range(1, 21)) and slow_a == slow_b == 21  # the same ids in both
    assert query(dsn, "SELECT count(*) FROM pg_namespace WHERE nspname = 'shardworker'") == [(0,)]

    dirs = {app: (tmp_path / app / "outbox", tmp_path / app / "counts") for app in ("a", "b")}
    for _, counts in dirs.values():
        counts.mkdir(parents=True)
    worker_a = start_worker(dsn, *dirs["a"], "--schema", "app_a", procs=2)
    try:
        wait_for(lambda: statuses(dsn, "app_a").get(slow_a) == "running", 30, "app a's slow job to run")
        # app b's job 21 has the same id: cancelling it there never reaches app a's worker.
        assert sw(dsn, "jobs", "cancel", str(slow_b), "--json", schema="app_b") == '{"cancel":1}\n'
        assert sw(dsn, "queues", "pause", "default", "--schema", "app_b").strip()
        assert [w["worker_id"] for w in json.loads(sw(dsn, "workers", "--json", schema="app_b"))] == []
        assert len(json.loads(sw(dsn, "workers", "--json", schema="app_a"))) == 1
        wait_for(lambda: set(statuses(dsn, "app_a").values()) == {"done"}, 60, "app a's jobs to finish")
        assert set(statuses(dsn, "app_b").values()) == {"queued", "cancelled"}  # untouched but its own cancel
    finally:
        worker_a.terminate()
        assert exit_code(worker_a, 60, dirs["a"][1]) == 0
    assert statuses(dsn, "app_a")[slow_a] == "done"
    paused = json.loads(sw(dsn, "queues", "--json", schema="app_a"))
    assert all(not q["paused"] for q in paused), paused

    # App a's outbox is bound to app a's schema: a worker of app b on it is refused.
    wrong = subprocess.run([sys.executable, "-m", "shardworker", "run", "--app", "counting_app", "--schema", "app_b",
                            "--outbox-dir", str(dirs["a"][0]), "--dsn", dsn, "--exit-when-idle"],
                           env=worker_env(dirs["a"][1]), capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 1 and "belongs to" in wrong.stderr, wrong.stderr[-2000:]
    sw(dsn, "queues", "resume", "default", schema="app_b")
    worker_b = start_worker(dsn, *dirs["b"], "--exit-when-idle", procs=1, app="counting_app")
    # (no --schema: the environment names none, and app b's worker must not run the default schema)
    assert exit_code(worker_b, 60, dirs["b"][1]) == 1  # the shardworker schema does not exist here
    env_b = worker_env(dirs["b"][1]) | {"SHARDWORKER_SCHEMA": "app_b"}
    run_b = subprocess.run([sys.executable, "-m", "shardworker", "run", "--app", "counting_app", "--procs", "1",
                            "--outbox-dir", str(dirs["b"][0]), "--dsn", dsn, "--exit-when-idle"],
                           env=env_b, capture_output=True, text=True, timeout=120)
    assert run_b.returncode == 0, run_b.stderr[-2000:]
    assert statuses(dsn, "app_b") == {**{i: "done" for i in b_ids}, slow_b: "cancelled"}
    ran_a, ran_b = runs_per_job(dirs["a"][1]), runs_per_job(dirs["b"][1])
    assert dict(ran_a) == {i: 1 for i in [*a_ids, slow_a]} and dict(ran_b) == {i: 1 for i in b_ids}
    job = get_job(dsn, 3, schema="app_b")
    assert job is not None and job.result == {"id": 3, "echo": {"app": "b", "n": 2}}
    stats = json.loads(sw(dsn, "stats", "--exact", "--json", "--schema", "app_a"))
    assert stats["total"]["done"] == 21


def test_a_schema_name_is_checked_in_one_line(empty_dsn: str) -> None:
    err = sw(empty_dsn, "migrate", "--schema", "App-2", code=2)
    assert "'App-2' is not a schema name" in err and "Traceback" not in err
    assert "PostgreSQL's own" in sw(empty_dsn, "jobs", "list", "--schema", "pg_catalog", code=2)
    with pytest.raises(ConfigError, match="not a schema name"):
        enqueue(empty_dsn, "count", schema="x;drop")


def test_a_command_run_in_process_leaves_its_process_in_the_schema_it_found(empty_dsn: str, monkeypatch:
                                                                             pytest.MonkeyPatch) -> None:
    """--schema holds for the command and the processes it starts; a command run in-process (as
    tests and embedding code run them) gives its process back as it was."""
    import os

    from click.testing import CliRunner

    from shardworker.cli.main import main
    from shardworker.store.sql import current_schema

    monkeypatch.delenv("SHARDWORKER_SCHEMA", raising=False)
    result = CliRunner().invoke(main, ["migrate", "--schema", "app_c", "--dsn", empty_dsn])
    assert result.exit_code == 0, result.output
    assert current_schema() == "shardworker" and "SHARDWORKER_SCHEMA" not in os.environ
    monkeypatch.setenv("SHARDWORKER_SCHEMA", "app_c")  # read when it is used, not once
    assert current_schema() == "app_c"


def test_a_missing_schema_says_which_and_how_to_make_it(empty_dsn: str) -> None:
    err = sw(empty_dsn, "jobs", "list", "--schema", "nosuch", code=1)
    assert "schema nosuch is missing or out of date: run `shardworker migrate --schema nosuch`" in err, err


def test_a_job_s_event_stream_reads_the_schema_it_was_made_in(empty_dsn: str) -> None:
    """job_events is read after the route returned: it keeps the schema in use when it was made."""
    import asyncio

    pytest.importorskip("psycopg_pool")
    from shardworker.asgi import follow
    from shardworker.store.pool import make_pool

    sw(empty_dsn, "migrate", "--schema", "app_d")
    sw(empty_dsn, "migrate", "--schema", "app_e")
    assert enqueue(empty_dsn, "count", schema="app_d") == 1
    assert enqueue(empty_dsn, "count", schema="app_e") == 1
    query(empty_dsn, "UPDATE app_d.jobs SET status = 'done', result = '1', finished_at = now() RETURNING id")

    async def events(schema: str) -> list[str]:
        pool = make_pool(empty_dsn, min_size=1, max_size=1, application_name="test")
        await pool.open(wait=True)
        try:
            seen = []
            async for event in follow(pool, 1, timeout_s=1.5, every_s=0.1, schema=schema):
                seen.append(event.split("\n", 1)[0])
            return seen
        finally:
            await pool.close()

    assert asyncio.run(events("app_d"))[-1] == "event: end"
    assert "event: end" not in asyncio.run(events("app_e"))  # still queued there


def test_a_command_that_finds_nothing_names_the_other_schemas(empty_dsn: str) -> None:
    """A user who forgot --schema (or gave the wrong one) learns where the jobs are."""
    sw(empty_dsn, "migrate", "--schema", "app_f")
    sw(empty_dsn, "migrate", "--schema", "app_g")
    assert enqueue(empty_dsn, "count", schema="app_f") == 1
    hint = "(in schema app_g; this database holds others: app_f: give --schema)"
    assert hint in sw_err(empty_dsn, "jobs", "list", "--schema", "app_g")
    assert hint in sw(empty_dsn, "workers", "--schema", "app_g")
    assert hint in sw(empty_dsn, "jobs", "cancel", "1", "--schema", "app_g", code=1)
    assert hint in sw(empty_dsn, "jobs", "show", "1", "--schema", "app_g", code=1)
    assert "holds others" not in sw(empty_dsn, "jobs", "show", "1", "--schema", "app_f")


def sw_err(dsn: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "shardworker", *args, "--dsn", dsn], capture_output=True, text=True,
                          env=worker_env(Path.cwd()), timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr
