"""A user's project for console-script tests: a directory with its app module (``tasks.py``)
and a ``ledger/`` folder, and ``shardworker`` run in it as a subprocess, the way a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

from tests.cli.test_project_dir import shardworker_script


def make_project(parent: Path, name: str, app_source: str) -> Path:
    root = parent / name
    (root / "ledger").mkdir(parents=True)
    (root / "tasks.py").write_text(textwrap.dedent(app_source).lstrip())
    return root


def run_in(project: Path, dsn: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``shardworker ARGS --dsn DSN`` from ``project``, without the test run's PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SHARDWORKER_DSN")}
    return subprocess.run([*shardworker_script(), *args, "--dsn", dsn], cwd=project, env=env, input=stdin,
                          capture_output=True, text=True, timeout=90)


def run_ok(project: Path, dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``run_in`` that must exit 0 (the failure shows the command's output)."""
    done = run_in(project, dsn, *args)
    assert done.returncode == 0, (args, done.stdout, done.stderr[-3000:])
    return done


def enqueue_in(project: Path, dsn: str, kind: str) -> int:
    """``shardworker enqueue KIND`` from ``project``; the job's id."""
    (job_id,) = json.loads(run_ok(project, dsn, "enqueue", kind, "--json").stdout)["ids"]
    return int(job_id)
