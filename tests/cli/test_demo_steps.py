"""``shardworker demo --steps`` as a user runs it: the console script from a project directory,
its own embedded PostgreSQL stopped for real, the whole worker killed -9 between steps and
started again while the database is down, and a final table counted from inside the steps."""

from __future__ import annotations

import collections
import os
import re
import subprocess
from pathlib import Path

from shardworker.embedded import EmbeddedPostgres
from tests.cli.test_project_dir import shardworker_script

STEPS_PER_JOB = 4


def rows_of(stdout: str) -> dict[str, str]:
    """The final table's rows: name, two spaces or more, value."""
    pairs = (re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in stdout.splitlines()
             if line.strip() and not line.startswith("-"))
    return {pair[0]: pair[1] for pair in pairs if len(pair) == 2}


def number(value: str) -> int:
    return int(value.split()[0].replace(",", ""))


def demo_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SHARDWORKER_DSN")}


def test_the_steps_demo_reruns_no_step(tmp_path: Path) -> None:
    demo_dir = tmp_path / ".shardworker" / "steps-demo"
    try:
        done = subprocess.run([*shardworker_script(), "demo", "--steps", "--jobs", "300", "--outage-seconds", "3"],
                              cwd=tmp_path, env=demo_env(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        assert not EmbeddedPostgres(demo_dir / "pgdata").is_running()
    finally:
        EmbeddedPostgres(demo_dir / "pgdata").stop("immediate")
    rows = rows_of(done.stdout)
    assert rows["jobs"].startswith("300 ") and rows["final rows"] == "done 300", done.stdout
    assert number(rows["steps re-run"]) == 0
    assert number(rows["steps recorded"]) == 300 * STEPS_PER_JOB
    # The kill cut jobs between steps: they ran again, and got their recorded steps back.
    assert number(rows["handler runs"]) > 300 and number(rows["steps replayed"]) > 0, done.stdout
    for phase in ("stopping PostgreSQL", "kill -9", "PostgreSQL still down", "starting PostgreSQL again"):
        assert phase in done.stderr, done.stderr
    # The table's counts are the ledger's, which the steps appended to themselves.
    lines = [line.split() for f in (demo_dir / "ledger").iterdir() for line in f.read_text().splitlines()]
    step_runs = collections.Counter((int(job), name) for tag, job, _, name in (x for x in lines if x[0] == "step"))
    assert number(rows["steps run"]) == sum(step_runs.values()) >= 300 * STEPS_PER_JOB
    assert len(step_runs) == 300 * STEPS_PER_JOB
    assert number(rows["steps replayed"]) == sum(1 for x in lines if x[0] == "replay")
    assert number(rows["handler runs"]) == sum(1 for x in lines if x[0] == "run")


def test_the_steps_demo_refuses_a_dsn_and_the_outage_demo_beside_it(tmp_path: Path) -> None:
    refused = subprocess.run([*shardworker_script(), "demo", "--steps", "--dsn", "postgresql://app@db/app"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert "demo --steps stops PostgreSQL, so it runs only on an embedded server of its own: drop --dsn" \
        in refused.stderr
    both = subprocess.run([*shardworker_script(), "demo", "--steps", "--outage"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert both.returncode == 2 and "--outage and --steps are two demos: choose one" in both.stderr
    assert not (tmp_path / ".shardworker").exists()
