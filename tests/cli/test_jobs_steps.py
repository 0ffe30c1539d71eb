"""What operators see and steer of a job's durable steps, through ``shardworker jobs`` run as
a subprocess on a real PostgreSQL: ``show`` lists them (text and JSON), ``retry`` keeps them,
``retry --reset-steps`` forgets them, and deleting or pruning a job deletes them. Step rows
are written with plain INSERTs, as the flusher writes them."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta
from typing import Any

from shardworker import jobs
from tests.helpers import enqueue, execute, query


def shardworker(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The console command as a user runs it."""
    return subprocess.run([sys.executable, "-m", "shardworker", *args, "--dsn", dsn], capture_output=True, text=True,
                          timeout=60)


def record_step(dsn: str, job_id: int, name: str, result: Any, *, attempt: int = 1,
                at: datetime | None = None) -> None:
    execute(dsn, "INSERT INTO shardworker.job_steps (job_id, name, attempt, result, recorded_at) "
                 "VALUES (%s, %s, %s, %s::jsonb, coalesce(%s, now()))", job_id, name, attempt, json.dumps(result), at)


def step_names(dsn: str, job_id: int) -> list[str]:
    return [r[0] for r in query(dsn, "SELECT name FROM shardworker.job_steps WHERE job_id = %s ORDER BY name", job_id)]


def fail(dsn: str, job_id: int, attempt: int, kind: str | None = None) -> None:
    execute(dsn, "UPDATE shardworker.jobs SET status = 'failed', attempt = %s, max_attempts = %s, "
                 "finished_at = now(), kind = coalesce(%s, kind) WHERE id = %s", attempt, attempt, kind, job_id)


def reset_attempts(dsn: str) -> dict[int, int]:
    return dict(query(dsn, "SELECT id, steps_reset_attempt FROM shardworker.jobs"))


def test_show_lists_the_steps_in_recorded_order_then_name(pg_dsn: str) -> None:
    [job_id] = enqueue(pg_dsn, "extract", 1)
    t0 = query(pg_dsn, "SELECT now() - interval '1 minute'")[0][0]
    record_step(pg_dsn, job_id, "chunk", [1, 2, 3], attempt=2, at=t0 + timedelta(seconds=5))
    record_step(pg_dsn, job_id, "ocr", "héllo", at=t0)
    record_step(pg_dsn, job_id, "download", {"n": None}, at=t0)
    shown = shardworker(pg_dsn, "jobs", "show", str(job_id), "--json")
    assert shown.returncode == 0, shown.stderr
    # sizes are the bytes of the result's JSON text as PostgreSQL writes it: é is two
    assert json.loads(shown.stdout)["steps"] == [
        {"name": "download", "attempt": 1, "recorded_at": t0.isoformat(), "bytes": len('{"n": null}')},
        {"name": "ocr", "attempt": 1, "recorded_at": t0.isoformat(), "bytes": 8},
        {"name": "chunk", "attempt": 2, "recorded_at": (t0 + timedelta(seconds=5)).isoformat(), "bytes": 9}]
    text = shardworker(pg_dsn, "jobs", "show", str(job_id))
    assert text.returncode == 0 and text.stderr == "", text.stderr
    lines = text.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.strip().startswith("steps:"))
    assert header > next(i for i, line in enumerate(lines) if line.strip().startswith("locked_by:"))
    assert lines[header].split() == ["steps:", "3"]
    assert [line.split() for line in lines[header + 1:]] == [
        ["download", "attempt", "1", t0.isoformat(), "11", "bytes"],
        ["ocr", "attempt", "1", t0.isoformat(), "8", "bytes"],
        ["chunk", "attempt", "2", (t0 + timedelta(seconds=5)).isoformat(), "9", "bytes"]]
    assert [s.name for s in jobs.get_steps(pg_dsn, job_id)] == ["download", "ocr", "chunk"]


def test_a_job_without_steps_shows_none(pg_dsn: str) -> None:
    [job_id] = enqueue(pg_dsn, "plain", 1)
    shown = shardworker(pg_dsn, "jobs", "show", str(job_id), "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["steps"] == [], shown.stderr
    text = shardworker(pg_dsn, "jobs", "show", str(job_id))
    assert text.stdout.splitlines()[-1].split() == ["steps:", "none"]
    assert jobs.get_steps(pg_dsn, job_id) == []


def test_ten_thousand_steps_all_in_json_and_the_first_50_in_text(pg_dsn: str) -> None:
    [job_id] = enqueue(pg_dsn, "agent", 1)
    execute(pg_dsn, "INSERT INTO shardworker.job_steps (job_id, name, attempt, result, recorded_at) "
                    "SELECT %s, 'call-' || lpad(i::text, 5, '0'), 1, to_jsonb(i), now() + i * interval '1 ms' "
                    "FROM generate_series(1, 10000) i", job_id)
    shown = shardworker(pg_dsn, "jobs", "show", str(job_id), "--json")
    steps = json.loads(shown.stdout)["steps"]
    assert len(steps) == 10_000 and steps[0]["name"] == "call-00001" and steps[-1]["name"] == "call-10000"
    text = shardworker(pg_dsn, "jobs", "show", str(job_id)).stdout.splitlines()
    header = next(i for i, line in enumerate(text) if line.strip().startswith("steps:"))
    assert text[header].split() == ["steps:", "10000"]
    listed = text[header + 1:]
    assert len(listed) == 51 and listed[49].split()[0] == "call-00050"
    assert listed[50].strip() == "… and 9950 more (--json lists them all)"


def test_retry_keeps_the_steps(pg_dsn: str) -> None:
    [job_id] = enqueue(pg_dsn, "extract", 1)
    record_step(pg_dsn, job_id, "ocr", "text")
    fail(pg_dsn, job_id, 2)
    done = shardworker(pg_dsn, "jobs", "retry", str(job_id))
    assert done.returncode == 0 and done.stdout == "1 job queued again\n", done.stderr
    assert step_names(pg_dsn, job_id) == ["ocr"] and reset_attempts(pg_dsn) == {job_id: 0}


def test_retry_reset_steps_forgets_the_steps_of_the_jobs_it_queues_again(pg_dsn: str) -> None:
    a, b, other, done_job = enqueue(pg_dsn, "extract", 4)
    for job_id in (a, b, other, done_job):
        record_step(pg_dsn, job_id, "ocr", "text")
    record_step(pg_dsn, a, "chunk", [1])
    fail(pg_dsn, a, 3)
    fail(pg_dsn, b, 2)
    fail(pg_dsn, other, 1)
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'done', attempt = 1 WHERE id = %s", done_job)
    refused = shardworker(pg_dsn, "jobs", "retry", str(done_job), "--reset-steps")
    assert refused.returncode == 1 and "nothing changed" in refused.stderr
    assert step_names(pg_dsn, done_job) == ["ocr"] and reset_attempts(pg_dsn)[done_job] == 0
    reset = shardworker(pg_dsn, "jobs", "retry", str(a), str(b), str(done_job), "--reset-steps", "--json")
    assert reset.returncode == 0, reset.stderr
    assert json.loads(reset.stdout) == {"retry": 2, "skipped": [{"id": done_job, "why": "it is done"}]}
    assert step_names(pg_dsn, a) == [] and step_names(pg_dsn, b) == []
    assert step_names(pg_dsn, other) == ["ocr"] and step_names(pg_dsn, done_job) == ["ocr"]
    assert reset_attempts(pg_dsn) == {a: 3, b: 2, other: 0, done_job: 0}
    assert shardworker(pg_dsn, "jobs", "retry", str(a), "--reset-steps").returncode == 1  # queued: refused


def test_retry_failed_reset_steps_forgets_only_the_jobs_queued_again(pg_dsn: str) -> None:
    a, b, c = enqueue(pg_dsn, "extract", 3)
    for job_id in (a, b, c):
        record_step(pg_dsn, job_id, "ocr", "text")
    fail(pg_dsn, a, 2)
    fail(pg_dsn, b, 1, kind="other")
    text = shardworker(pg_dsn, "jobs", "retry", "--failed", "--kind", "extract", "--reset-steps")
    assert text.returncode == 0 and text.stdout == "1 job queued again, its steps forgotten\n", text.stderr
    assert (step_names(pg_dsn, a), step_names(pg_dsn, b), step_names(pg_dsn, c)) == ([], ["ocr"], ["ocr"])
    assert reset_attempts(pg_dsn) == {a: 2, b: 0, c: 0}


def test_the_python_api_takes_reset_steps(pg_dsn: str) -> None:
    a, b = enqueue(pg_dsn, "extract", 2)
    for job_id in (a, b):
        record_step(pg_dsn, job_id, "ocr", "text")
        fail(pg_dsn, job_id, 1)
    assert jobs.retry(pg_dsn, [a]) == 1 and step_names(pg_dsn, a) == ["ocr"]
    fail(pg_dsn, a, 2)
    assert jobs.retry(pg_dsn, [a], reset_steps=True) == 1 and step_names(pg_dsn, a) == []
    assert jobs.retry_failed(pg_dsn, reset_steps=True) == 1 and step_names(pg_dsn, b) == []
    assert reset_attempts(pg_dsn) == {a: 2, b: 1}


def test_deleting_or_pruning_a_job_deletes_its_steps(pg_dsn: str) -> None:
    deleted, pruned, recent = enqueue(pg_dsn, "extract", 3)
    for job_id in (deleted, pruned, recent):
        record_step(pg_dsn, job_id, "ocr", "text")
        execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'done', finished_at = now() WHERE id = %s", job_id)
    execute(pg_dsn, "UPDATE shardworker.jobs SET finished_at = now() - interval '8 days' WHERE id = %s", pruned)
    assert shardworker(pg_dsn, "jobs", "delete", str(deleted)).returncode == 0
    assert json.loads(shardworker(pg_dsn, "prune", "--older-than", "7d", "--json").stdout) == {"pruned": 1}
    assert query(pg_dsn, "SELECT job_id FROM shardworker.job_steps") == [(recent,)]
