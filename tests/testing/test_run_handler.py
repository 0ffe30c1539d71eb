"""``shardworker.testing.run_handler``: a handler run in-process on the child's own code, no
worker and no database: sync, ``async def`` and ``threads=True`` handlers; results as stored;
steps recorded and replayed; follow-ups returned; ``Retry``, ``Snooze``, ``Fail`` and
``Cancel`` as a status; a handler's exception raised as itself (or kept with ``raises=False``)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from shardworker import App, Cancel, Fail, Job, Retry, Snooze, StepError
from shardworker.testing import HandlerFailed, run_handler, run_handler_async

app = App()
CALLS: list[str] = []


@app.handler("extract")
def extract(job: Job) -> dict[str, Any]:
    pages = job.step("ocr", lambda url: CALLS.append(f"ocr {url}") or ["p1", "p2"], job.payload["url"])
    first = job.enqueue("embed", {"page": pages[0]}, queue="gpu", priority=3)
    job.enqueue("index", {"pages": len(pages)}, after=[first, 7], delay_s=5)
    return {"pages": len(pages), "attempt": job.attempt, "dependency": job.dependencies.get(7)}


@app.handler("fetch")
async def fetch(job: Job) -> tuple[int, str]:
    await asyncio.sleep(0)
    size = await job.step("size", _size, job.payload)
    return size, job.queue


async def _size(payload: Any) -> int:
    await asyncio.sleep(0)
    return len(payload)


@app.handler("blocking", threads=True)
def blocking(job: Job) -> str:
    if threading.current_thread() is threading.main_thread():
        return "main"
    return str(job.step("read", str.upper, job.payload))


@app.handler("steer")
def steer(job: Job) -> None:
    what = job.payload
    if what == "retry":
        raise Retry("busy", delay_s=5)
    if what == "snooze":
        raise Snooze(delay_s=30)
    if what == "fail":
        raise Fail("no card")
    if what == "cancel":
        raise Cancel("withdrawn")
    if what == "boom":
        raise ValueError("boom")
    if what == "twice":
        job.step("a", int)
        job.step("a", int)
    if what == "unstorable":
        return {1, 2}  # type: ignore[return-value]


@app.handler("slow", timeout_s=0.05)
async def slow(job: Job) -> None:
    await asyncio.sleep(5)


def test_a_sync_handler_returns_its_result_as_stored_with_steps_and_followups() -> None:
    CALLS.clear()
    run = run_handler(app, "extract", {"url": "u"}, attempt=2, dependencies={7: "ok"})
    assert run.status == "done"
    assert run.result == {"pages": 2, "attempt": 2, "dependency": "ok"}
    assert run.steps == {"ocr": ["p1", "p2"]} and run.replayed == [] and CALLS == ["ocr u"]
    embed, index = run.followups
    assert (embed.kind, embed.payload, embed.queue, embed.priority) == ("embed", {"page": "p1"}, "gpu", 3)
    assert (index.kind, index.payload, index.delay_s, index.after, index.after_followups) == (
        "index", {"pages": 2}, 5.0, (7,), (0,))


def test_steps_given_are_replayed_not_run() -> None:
    CALLS.clear()
    run = run_handler(app, "extract", {"url": "u"}, steps={"ocr": ["only"]})
    assert run.result["pages"] == 1 and run.replayed == ["ocr"] and run.steps == {} and CALLS == []


def test_an_async_handler_runs_on_an_event_loop_and_its_result_is_json() -> None:
    run = run_handler(app, "fetch", "abc", queue="web")
    assert run.result == [3, "web"] and run.steps == {"size": 3}  # a tuple comes back a list, as stored


def test_run_handler_async_inside_a_running_loop() -> None:
    async def main() -> tuple[Any, Any]:
        return (await run_handler_async(app, "fetch", "abcd", steps={"size": 9}),
                await run_handler_async(app, "blocking", "xy"))  # a sync one on a thread, off the loop

    run, threaded = asyncio.run(main())
    assert run.result == [9, "default"] and run.replayed == ["size"]
    assert threaded.result == "XY"


def test_run_handler_inside_a_running_loop_says_to_await_the_async_one() -> None:
    async def main() -> None:
        run_handler(app, "fetch", "x")

    with pytest.raises(RuntimeError, match="run_handler_async"):
        asyncio.run(main())


def test_a_threaded_handler_runs_on_a_thread_of_its_own() -> None:
    assert run_handler(app, "blocking", "abc").result == "ABC"


@pytest.mark.parametrize(("asked", "status", "error", "delay"), [
    ("retry", "retry", "Retry: busy", 5.0), ("snooze", "snoozed", None, 30.0),
    ("fail", "failed", "Fail: no card", 0.0), ("cancel", "cancelled", "withdrawn", 0.0)])
def test_control_exceptions_are_a_status(asked: str, status: str, error: str | None, delay: float) -> None:
    run = run_handler(app, "steer", asked)
    assert (run.status, run.error, run.delay_s, run.followups) == (status, error, delay, [])
    with pytest.raises(HandlerFailed, match=status):
        _ = run.result


def test_a_handlers_exception_is_raised_as_itself_or_kept_as_the_worker_would() -> None:
    with pytest.raises(ValueError, match="boom"):
        run_handler(app, "steer", "boom")
    run = run_handler(app, "steer", "boom", raises=False, attempt=3)
    assert run.status == "retry" and run.error is not None and run.error.startswith("ValueError: boom")
    assert run.traceback is not None and "Traceback" in run.traceback and run.delay_s > 0
    with pytest.raises(HandlerFailed, match="ValueError: boom"):
        _ = run.result


def test_a_failure_on_the_last_attempt_ends_failed_as_in_a_worker() -> None:
    """With no attempt left, an exception or a Retry fails the job for good, as the row would."""
    assert run_handler(app, "steer", "boom", raises=False, attempt=3, max_attempts=3).status == "failed"
    assert run_handler(app, "steer", "retry", attempt=3, max_attempts=3).status == "failed"
    assert run_handler(app, "steer", "boom", raises=False, attempt=2, max_attempts=3).status == "retry"


def test_a_misused_step_or_an_unstorable_result_fails_as_in_a_worker() -> None:
    with pytest.raises(StepError, match="ran twice"):
        run_handler(app, "steer", "twice")
    with pytest.raises(HandlerFailed, match="not JSON"):
        run_handler(app, "steer", "unstorable")
    assert run_handler(app, "steer", "unstorable", raises=False).status == "failed"


def test_an_async_handler_past_its_timeout_fails_the_attempt() -> None:
    run = run_handler(app, "slow", None, raises=False)
    assert run.status == "retry" and run.error is not None and "timed out after 0.05s" in run.error


def test_an_unknown_kind_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="no handler for kind 'nope'"):
        run_handler(app, "nope", None)
