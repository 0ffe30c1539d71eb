"""Reading the step ledger of ``tests/apps/steps_app.py``: how often each step of each job ran."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

from tests.helpers import query

STEPS = ("fetch", "ocr", "chunk")


def ledger(count_dir: Path) -> list[tuple[int, int, str, str]]:
    """Every ledger line of every process as (time ns, job id, step name, event), in time order."""
    lines = []
    for path in count_dir.glob("steps-*.log"):
        for line in path.read_text().splitlines():
            job_id, name, event, at = line.split()
            lines.append((int(at), int(job_id), name, event))
    return sorted(lines)


def step_runs(count_dir: Path) -> collections.Counter[tuple[int, str]]:
    """How many times each (job id, step name) ran, from every process's ledger."""
    return collections.Counter((job_id, name) for _, job_id, name, event in ledger(count_dir) if event == "run")


def reruns_after_return(count_dir: Path) -> list[tuple[int, str]]:
    """(job id, step name) of the steps that ran again after a run of theirs had returned:
    what the promise forbids. (A step cut short by a kill before its record was durable may
    run again: it never returned.)"""
    returned: set[tuple[int, str]] = set()
    broken = []
    for _, job_id, name, event in ledger(count_dir):
        if event == "returned":
            returned.add((job_id, name))
        elif (job_id, name) in returned:
            broken.append((job_id, name))
    return broken


def assert_steps_once(dsn: str, count_dir: Path, job_ids: list[int], *, exactly: bool = True) -> None:
    """Every job done with every step's result, no step run again once it had returned, and
    every step recorded in shardworker.job_steps; with ``exactly``, each step ran once (no
    kill cut a step short)."""
    broken = [key for key in reruns_after_return(count_dir) if key[0] in job_ids]
    assert not broken, f"steps ran again after they had returned: {broken[:10]}"
    rows = {r[0]: r[1:] for r in query(dsn, "SELECT id, status, result FROM shardworker.jobs WHERE id = ANY(%s)",
                                        job_ids)}
    for job_id in job_ids:
        status, result = rows[job_id]
        assert status == "done" and result == {"id": job_id, "steps": [f"{n}-{job_id}" for n in STEPS]}, rows[job_id]
    ran = step_runs(count_dir)
    again = {key: n for key, n in ran.items() if n > 1 and key[0] in job_ids}
    assert not exactly or not again, f"steps ran again: {sorted(again.items())[:10]}"
    missing = [(j, n) for j in job_ids for n in STEPS if ran[(j, n)] < 1]
    assert not missing, f"steps never ran: {missing[:10]}"
    recorded = query(dsn, "SELECT job_id, name, result FROM shardworker.job_steps WHERE job_id = ANY(%s)", job_ids)
    assert sorted(recorded) == sorted((j, n, f"{n}-{j}") for j in job_ids for n in STEPS)


def steps_of(dsn: str, job_id: int) -> list[Any]:
    return query(dsn, "SELECT name, attempt FROM shardworker.job_steps WHERE job_id = %s ORDER BY recorded_at",
                 job_id)
