"""job.step's rules in a child's loop (a real outbox shard, in-process): replays, what a step
returns, and the misuses that fail the attempt and record nothing."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

import outbox
from outbox import OutboxReader
from shardworker import Cancel, Fail, Retry, Snooze, StepError
from shardworker.app import App
from shardworker.child import results
from shardworker.child.steps import MAX_STEPS
from shardworker.core import wire
from shardworker.core.jobstats import STEPS_AT, JobCounts
from shardworker.core.model import ClaimedJob, Disposition, Job, Outcome, StepRecord
from tests.child.loop_harness import Clock, jobs_msg, receive_until, start_runner


def run_one(tmp_path: Path, handler: Callable[..., Any], *, steps: dict[str, Any] | None = None,
            threads: bool = False) -> tuple[Outcome, list[StepRecord], JobCounts]:
    """Run one job of ``handler`` (given earlier steps' results) in a child's loop; its outcome,
    the step records in the shard, and the counts its reports carried."""
    app = App()
    app.handler("k", threads=threads, retry_delay=lambda attempt: 1.0)(handler)
    parent, thread, writer, _ = start_runner(tmp_path, app, Clock(50.0))
    claimed = ClaimedJob(7, "k", "default", "null", 2 if steps else 1, 25,
                         None if steps is None else orjson.dumps(steps).decode())
    try:
        parent.send(jobs_msg(claimed))
        counts = JobCounts()
        for msg in receive_until(parent, 1):
            if isinstance(msg, wire.Done) and msg.stats:
                counts.add(msg.stats)
        parent.send(wire.Stop())
        thread.join(10)
    finally:
        writer.close()
    with OutboxReader.open(str(tmp_path)) as reader:
        records = [wire.decode_record(r.payload) for r in reader.poll(100_000)]
    [outcome] = [r for r in records if isinstance(r, Outcome)]
    return outcome, [r for r in records if isinstance(r, StepRecord)], counts


def test_a_step_records_its_result_before_it_returns_and_gives_json_back(tmp_path: Path) -> None:
    """The record is in the shard (fsync'd by the group commit) when job.step returns, and the
    handler gets the value as JSON gives it back (a tuple becomes a list) on the first run too."""
    seen: dict[str, Any] = {}

    def handler(job: Job) -> str:
        seen["value"] = job.step("pair", lambda: (1, "two"))
        seen["durable"] = [wire.decode_record(p) for p in outbox.records_since(str(tmp_path), 0, 0.0)]
        return "ok"

    outcome, steps, counts = run_one(tmp_path, handler)
    assert outcome.disposition is Disposition.DONE and seen["value"] == [1, "two"]
    [durable] = seen["durable"]
    assert isinstance(durable, StepRecord) and durable.name == "pair" and durable.result_json == b'[1,"two"]'
    assert [(s.job_id, s.attempt, s.name) for s in steps] == [(7, 1, "pair")]
    assert counts.snapshot()["k"][STEPS_AT:] == [1, 0]  # recorded, replayed


@pytest.mark.parametrize("threads", [False, True])
def test_an_earlier_attempts_step_is_given_back_without_calling_fn(tmp_path: Path, threads: bool) -> None:
    calls: list[str] = []

    def handler(job: Job) -> Any:
        first = job.step("fetch", lambda: calls.append("fetch") or "again")
        second = job.step("parse", lambda: calls.append("parse") or {"n": 2})
        return [first, second]

    outcome, steps, counts = run_one(tmp_path, handler, steps={"fetch": {"pages": [1, 2]}}, threads=threads)
    assert outcome.result_json == b'[{"pages":[1,2]},{"n":2}]' and calls == ["parse"]
    assert [s.name for s in steps] == ["parse"]
    assert counts.snapshot()["k"][STEPS_AT:] == [1, 1]


def test_an_async_handler_awaits_steps_of_coroutine_and_plain_functions(tmp_path: Path) -> None:
    async def fetch(url: str) -> str:
        await asyncio.sleep(0)
        return url.upper()

    async def handler(job: Job) -> Any:
        page = await job.step("fetch", fetch, "a")
        size = await job.step("size", len, page)
        old = await job.step("old", fetch, "never")
        return [page, size, old, threading.current_thread().name]

    outcome, steps, _ = run_one(tmp_path, handler, steps={"old": "kept"})
    assert outcome.disposition is Disposition.DONE, outcome.error
    assert orjson.loads(outcome.result_json or b"")[:3] == ["A", 1, "kept"]
    assert [s.name for s in steps] == ["fetch", "size"]


def test_the_same_name_twice_fails_the_attempt_even_when_caught(tmp_path: Path) -> None:
    def handler(job: Job) -> str:
        job.step("a", lambda: 1)
        with contextlib.suppress(StepError):
            job.step("a", lambda: 2)
        return "pretends all is well"

    outcome, steps, _ = run_one(tmp_path, handler)
    assert outcome.disposition is Disposition.RETRY
    assert "step 'a' ran twice in one attempt of job 7" in (outcome.error or "")
    assert [s.result_json for s in steps] == [b"1"]


@pytest.mark.parametrize(("result", "why"), [(object(), "not JSON-serializable"), ("\x00", "NUL character"),
                                              ("x" * 2000, "result too large"), (float("nan"), "not a finite number"),
                                              ({"r": [1.0, float("inf")]}, "not a finite number")])
def test_an_unstorable_step_result_fails_the_attempt_and_records_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, result: object, why: str) -> None:
    monkeypatch.setattr(results, "MAX_RESULT_BYTES", 1000)
    calls_after: list[int] = []

    def handler(job: Job) -> str:
        job.step("bad", lambda: result)
        calls_after.append(1)
        return "never"

    outcome, steps, _ = run_one(tmp_path, handler)
    assert outcome.disposition is Disposition.RETRY and "step 'bad' of job 7" in (outcome.error or "")
    assert why in (outcome.error or "") and steps == [] and calls_after == []


def test_an_exception_from_fn_propagates_unrecorded(tmp_path: Path) -> None:
    def handler(job: Job) -> str:
        job.step("ok", lambda: "fine")
        job.step("flaky", lambda: 1 / 0)
        return "never"

    outcome, steps, _ = run_one(tmp_path, handler)
    assert outcome.disposition is Disposition.RETRY and "ZeroDivisionError" in (outcome.error or "")
    assert [s.name for s in steps] == ["ok"]


@pytest.mark.parametrize(("control", "disposition"), [(Retry("later", delay_s=5), Disposition.RETRY),
                                                      (Snooze(30), Disposition.SNOOZED),
                                                      (Fail("bad input"), Disposition.FAILED),
                                                      (Cancel("not wanted"), Disposition.CANCELLED)])
def test_job_controls_raised_in_a_step_steer_the_job(tmp_path: Path, control: Exception,
                                                     disposition: Disposition) -> None:
    def raise_it() -> None:
        raise control

    def handler(job: Job) -> str:
        job.step("steer", raise_it)
        return "never"

    outcome, steps, _ = run_one(tmp_path, handler)
    assert outcome.disposition is disposition and steps == []


def test_a_job_holds_at_most_max_steps(tmp_path: Path) -> None:
    earlier = {f"s{i}": i for i in range(MAX_STEPS)}

    def handler(job: Job) -> Any:
        return [job.step("s9999", lambda: "never"), job.step("one more", lambda: "too many")]

    outcome, steps, _ = run_one(tmp_path, handler, steps=earlier)
    assert outcome.disposition is Disposition.RETRY and f"already holds {MAX_STEPS} steps" in (outcome.error or "")
    assert steps == []


@pytest.mark.parametrize("name", ["", "x" * 201, 7, "nul\x00"])
def test_a_bad_step_name_fails_the_attempt(tmp_path: Path, name: Any) -> None:
    outcome, steps, _ = run_one(tmp_path, lambda job: job.step(name, lambda: 1))
    assert outcome.disposition is Disposition.RETRY and "step name must be" in (outcome.error or "")
    assert steps == []


def test_a_coroutine_function_in_a_sync_handler_is_refused(tmp_path: Path) -> None:
    async def fetch() -> str:
        return "page"

    outcome, steps, _ = run_one(tmp_path, lambda job: job.step("fetch", fetch))
    assert "returned an awaitable" in (outcome.error or "") and steps == []


def test_a_job_made_by_hand_has_no_steps() -> None:
    with pytest.raises(RuntimeError, match="inside a worker's handler"):
        Job(1, "k", "default", None, 1, 25).step("a", lambda: 1)


@pytest.mark.parametrize("result", [float("nan"), {"ratio": float("inf"), "ok": 1}, [float("-inf")]])
def test_a_result_that_is_not_a_finite_number_fails_the_job(tmp_path: Path, result: object) -> None:
    """orjson writes nan and infinity as null: such a result fails the job for good, as a result
    that is not JSON does, instead of ending done with nulls in it."""
    outcome, _, _ = run_one(tmp_path, lambda job: result)
    assert outcome.disposition is Disposition.FAILED and "not a finite number" in (outcome.error or ""), outcome
