"""``shardworker demo``, the README's first command, as a newcomer runs it: the console script
from a project directory. It shows its progress and its summary; its planned flaky failures
are one line each, and nothing reads as a crash (issue 42, 8)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.cli.test_demo_steps import demo_env
from tests.cli.test_project_dir import shardworker_script


def test_the_demo_runs_every_job_and_prints_no_traceback(pg_dsn: str, tmp_path: Path) -> None:
    done = subprocess.run([*shardworker_script(), "demo", "--jobs", "600", "--procs", "2", "--dsn", pg_dsn],
                          cwd=tmp_path, env=demo_env(), capture_output=True, text=True, timeout=180)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Traceback" not in output and " ERROR " not in output, output
    summary = re.search(r"demo: \d+ outcomes .*done=600 failed=0 queued=0 running=0; (\d+) planned flaky "
                        r"failures retried; outbox pending=0", output)
    assert summary, output
    retries = [line for line in output.splitlines() if "failed, retrying" in line]
    assert len(retries) == int(summary.group(1)), output
    assert all("(planned: the retry succeeds)" in line for line in retries), retries
