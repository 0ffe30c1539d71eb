"""job.step across retries, through a real worker and PostgreSQL: a step that returned never
runs again for its job, whichever lane runs the handler."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import enqueue, exit_code, runs_per_job, start_worker
from tests.steps.step_ledger import assert_steps_once, steps_of

KINDS = ["extract", "extract_threads", "agent"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_failure_after_a_step_retries_without_running_it_again(pg_dsn: str, tmp_path: Path, kind: str) -> None:
    """The handler fails after its second step on the first attempt: the retry gets the first
    two steps' results back and runs only the third."""
    outbox_dir, count_dir = tmp_path / "outbox", tmp_path / "counts"
    count_dir.mkdir()
    ids = enqueue(pg_dsn, kind, 6, {"fail_after": "ocr"})
    proc = start_worker(pg_dsn, outbox_dir, count_dir, "--exit-when-idle", app="steps_app")
    assert exit_code(proc, 60, count_dir) == 0
    assert all(n == 2 for n in runs_per_job(count_dir).values())  # the handler ran twice, its steps once
    assert_steps_once(pg_dsn, count_dir, ids)
    assert [attempt for _, attempt in steps_of(pg_dsn, ids[0])] == [1, 1, 2]
