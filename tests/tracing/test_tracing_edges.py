"""A traced run's edges (tests/tracing/edges.py, in a process of its own with the SDK): a
``trace`` column written by hand never fails a job; a failed last attempt's span says
``failed`` and leaves no link behind; a run something else stopped (``SystemExit``) still
ends its span, ``interrupted``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk.trace")


def test_a_traced_run_s_edges() -> None:
    done = subprocess.run([sys.executable, str(Path(__file__).parent / "edges.py")], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "SHARDWORKER_SCHEMA": "billing"})
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["hostile"] == ["done"] * 7 and found["hostile_spans"] == 7
    assert "tracing: starting the span of a run" not in done.stderr  # sanitized, not caught
    assert found["last"] == ["retry", False, "failed"]  # the row fails it; nothing kept to link
    assert found["again"] == ["retry", "00-", "retry"]
    assert found["schema"] == "billing"  # a worker of one app among several on a database
    assert found["exit"] == 3 and found["interrupted"] == ["interrupted", "ERROR", ["exception"]]
