"""Django in the test process, on real PostgreSQL: the project under ``project/`` (settings
``mysite.settings``, the ``shop`` app), set up once per test process on a database of its own
cloned from the migrated template (shardworker's schema, then Django's tables), and emptied
before each test. Workers run as ``shardworker run`` subprocesses on that same database."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.helpers import STARTED, exit_code

PROJECT = Path(__file__).parent / "project"
REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("django")
if sys.version_info < (3, 12):  # Django 6 needs 3.12: on 3.11, Django 5.2 and the backport
    pytest.importorskip("django_tasks")


@pytest.fixture(scope="session")
def django_dsn(pg_server: Any, pg_template: Any) -> Iterator[str]:
    """The Django project's database, set up in this process (``django.setup()``, tables made)."""
    name = f"django_{uuid.uuid4().hex}"
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name),
                                                                       sql.Identifier(pg_template.name)))
    dsn = pg_server.dsn_for(name)
    os.environ["SW_DJANGO_DSN"] = dsn
    os.environ["DJANGO_SETTINGS_MODULE"] = "mysite.settings"
    if str(PROJECT) not in sys.path:
        sys.path.insert(0, str(PROJECT))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", run_syncdb=True, verbosity=0)
    try:
        yield dsn
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(pg_server.admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def dsn(django_dsn: str) -> Iterator[str]:
    """The project's database, with no job and no order left by an earlier test."""
    with psycopg.connect(django_dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE shardworker.jobs, shop_order CASCADE")
    yield django_dsn
    from django.db import connections

    connections.close_all()


def console_script() -> str:
    """The ``shardworker`` command installed beside this Python."""
    path = Path(sys.executable).parent / "shardworker"
    assert path.exists(), f"no shardworker console script at {path}: pip install -e ."
    return str(path)


def start_worker(dsn: str, tmp_path: Path, *args: str, env: dict[str, str] | None = None,
                 give_dsn: bool = True) -> subprocess.Popen[bytes]:
    """``shardworker run --app shardworker.contrib.django:app --procs 1`` on ``dsn``, as an
    operator starts it (the console script, DJANGO_SETTINGS_MODULE, the project on PYTHONPATH),
    in its own process group (killed after the test). Its log goes to ``tmp_path/counts/worker.log``."""
    counts = tmp_path / "counts"
    counts.mkdir(exist_ok=True)
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "mysite.settings", "SW_DJANGO_DSN": dsn,
                   "SW_TEST_COUNT_DIR": str(counts),
                   "PYTHONPATH": os.pathsep.join([str(PROJECT), str(REPO), os.environ.get("PYTHONPATH", "")]),
                   **(env or {})}
    environment.pop("SHARDWORKER_DSN", None)
    cmd = [console_script(), "run", "--app", "shardworker.contrib.django:app", "--procs", "1",
           "--outbox-dir", str(tmp_path / "outbox"), *(("--dsn", dsn) if give_dsn else ()), *args]
    with open(counts / "worker.log", "ab") as log:
        proc = subprocess.Popen(cmd, env=environment, stdout=log, stderr=log, start_new_session=True,
                                cwd=tmp_path)
    STARTED.append(proc)
    return proc


def run_worker(dsn: str, tmp_path: Path, *args: str, env: dict[str, str] | None = None,
               timeout_s: float = 90.0) -> int:
    """``start_worker`` with ``--exit-when-idle``, until it exits; its exit code."""
    proc = start_worker(dsn, tmp_path, "--exit-when-idle", *args, env=env)
    return exit_code(proc, timeout_s, tmp_path / "counts")
