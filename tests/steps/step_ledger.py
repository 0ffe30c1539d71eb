"""Reading the step ledger of ``tests/apps/steps_app.py``: how often each step of each job ran."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

from tests.helpers import query

STEPS = ("fetch", "ocr", "chunk")


def step_runs(count_dir: Path) -> collections.Counter[tuple[int, str]]:
    """How many times each (job id, step name) ran, from every process's ledger."""
    counter: collections.Counter[tuple[int, str]] = collections.Counter()
    for path in count_dir.glob("steps-*.log"):
        for line in path.read_text().splitlines():
            job_id, name = line.split()
            counter[(int(job_id), name)] += 1
    return counter


def assert_steps_once(dsn: str, count_dir: Path, job_ids: list[int]) -> None:
    """Every job done with every step's result, each step run exactly once, and every step
    recorded in shardworker.job_steps."""
    rows = {r[0]: r[1:] for r in query(dsn, "SELECT id, status, result FROM shardworker.jobs WHERE id = ANY(%s)",
                                        job_ids)}
    for job_id in job_ids:
        status, result = rows[job_id]
        assert status == "done" and result == {"id": job_id, "steps": [f"{n}-{job_id}" for n in STEPS]}, rows[job_id]
    ran = step_runs(count_dir)
    again = {key: n for key, n in ran.items() if n > 1 and key[0] in job_ids}
    assert not again, f"steps ran again: {sorted(again.items())[:10]}"
    missing = [(j, n) for j in job_ids for n in STEPS if ran[(j, n)] != 1]
    assert not missing, f"steps never ran: {missing[:10]}"
    recorded = query(dsn, "SELECT job_id, name, result FROM shardworker.job_steps WHERE job_id = ANY(%s)", job_ids)
    assert sorted(recorded) == sorted((j, n, f"{n}-{j}") for j in job_ids for n in STEPS)


def steps_of(dsn: str, job_id: int) -> list[Any]:
    return query(dsn, "SELECT name, attempt FROM shardworker.job_steps WHERE job_id = %s ORDER BY recorded_at",
                 job_id)
