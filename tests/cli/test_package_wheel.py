"""A package, not a checkout: the wheel built from this tree holds what the product reads at run
time (migrations, SQL, templates, ``py.typed``) and runs from a project directory with nothing
of the repository on its path: ``migrate``, ``demo``, an app's worker, ``jobs show``. The wheel's
copy, not the checkout's, is the one imported (the test asks each process). Its dependencies are
this environment's (``--no-deps``): what is tested is the package, not an index."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built and unpacked into a directory of its own (``pip --target``)."""
    root = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(root / "dist"),
                            str(REPO)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (wheel,) = (root / "dist").glob("shardworker-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"shardworker/py.typed", "shardworker/store/sql/queries.sql", "shardworker/migrations/0001_create_jobs.sql",
            "shardworker/dashboard/templates/job.html", "outbox/__init__.py"} <= names
    target = root / "site"
    unpacked = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                               str(wheel)], capture_output=True, text=True, timeout=300)
    assert unpacked.returncode == 0, unpacked.stderr
    return target


def test_the_wheel_runs_from_a_project_without_the_repository(installed: Path, tmp_path: Path, pg_dsn: str) -> None:
    project = tmp_path / "project"
    (project / "billing").mkdir(parents=True)
    (project / "billing" / "__init__.py").write_text("")
    (project / "billing" / "jobs.py").write_text(
        "import shardworker\nfrom shardworker import App, Job\n\napp = App()\n\n\n"
        "@app.handler('invoice')\ndef invoice(job: Job) -> str:\n    return shardworker.__file__\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SHARDWORKER_DSN")}
    env["PYTHONPATH"] = str(installed)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "shardworker", *args], cwd=project, env=env,
                              capture_output=True, text=True, timeout=180)

    where = subprocess.run([sys.executable, "-c", "import shardworker; print(shardworker.__file__)"], cwd=project,
                           env=env, capture_output=True, text=True, timeout=60)
    assert where.stdout.strip().startswith(str(installed)), where
    assert run("migrate", "--dsn", pg_dsn).returncode == 0
    demo = run("demo", "--jobs", "200", "--procs", "2", "--dsn", pg_dsn)
    assert demo.returncode == 0, demo.stderr[-3000:]
    enqueued = run("enqueue", "invoice", "--json", "--dsn", pg_dsn)
    assert enqueued.returncode == 0, enqueued.stderr
    job_id = enqueued.stdout.split('"ids":[')[1].split("]")[0]
    worked = run("run", "--app", "billing.jobs", "--procs", "1", "--exit-when-idle", "--outbox-dir", "var/outbox",
                 "--dsn", pg_dsn)
    assert worked.returncode == 0, worked.stderr[-3000:]
    shown = run("jobs", "show", job_id, "--json", "--dsn", pg_dsn)
    assert str(installed) in shown.stdout and '"status":"done"' in shown.stdout.replace(" ", "")


USER_CODE = '''
"""A user's app and client code, as typed as its author can make it."""
from __future__ import annotations

import asyncio
from typing import Any

import psycopg

import shardworker
from shardworker import App, EventTimeout, Job, JobSpec, Retry, Snooze
from shardworker import jobs as sw_jobs
from shardworker.testing import run_handler

app = App()


@app.handler("resize", max_attempts=5, timeout_s=30)
def resize(job: Job) -> dict[str, Any]:
    url: str = job.payload["url"]
    pages: int = job.step("count", len, url)
    job.progress({"pages": pages})
    try:
        decision = job.wait_event("ok", f"resize:{job.id}", timeout_s=60)
    except EventTimeout:
        raise Retry("later", delay_s=5) from None
    job.sleep("cool", 1.5)
    job.send_event("resized", {"id": job.id})
    if not decision:
        raise Snooze(10)
    return {"pages": pages}


@app.handler("fetch")
async def fetch(job: Job) -> int:
    n: int = await job.step("n", lambda: 3)
    await job.sleep("nap", 1)
    return n


def enqueue_some(dsn: str) -> list[int | None]:
    with psycopg.connect(dsn) as conn:
        one: int | None = shardworker.enqueue(conn, "resize", {"url": "x"}, key="acme")
        many = shardworker.enqueue_many(conn, [JobSpec("resize", {"url": "y"})])
        woken: int = shardworker.send_event(conn, "resized", {"id": 1})
    info = shardworker.wait_for(dsn, one or 0, 5, on_progress=print)
    listed = sw_jobs.list_jobs(dsn, status="waiting", limit=5)
    waiting_on: list[str] = [j.waiting_on for j in listed]
    print(info.status, woken, waiting_on)
    return [one, *many]


async def enqueue_async(dsn: str) -> int | None:
    job_id = await shardworker.enqueue_async(dsn, "fetch", None)
    await shardworker.send_event_async(dsn, "k", 1)
    return job_id


def check() -> None:
    assert run_handler(app, "resize", {"url": "abc"}).status == "suspended"
    asyncio.run(enqueue_async("postgresql://x"))
'''


def test_code_using_the_public_api_passes_mypy_strict(installed: Path, tmp_path: Path) -> None:
    """The wheel ships ``py.typed`` and types complete enough that a user's code checks under
    ``mypy --strict``: handlers, steps, waits, enqueue, events, waits for results, the test kit."""
    (tmp_path / "user_app.py").write_text(USER_CODE)
    checked = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                              "--cache-dir", str(tmp_path / ".mypy_cache"), "user_app.py"], cwd=tmp_path,
                             env={**os.environ, "MYPYPATH": str(installed)}, capture_output=True, text=True,
                             timeout=300)
    assert checked.returncode == 0, checked.stdout
