"""The worker run as a user runs it: the installed ``shardworker`` script, from a project
directory that holds its own folders (one named ``outbox/``, one named ``shardworker/``),
its app module, and relative paths."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
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
