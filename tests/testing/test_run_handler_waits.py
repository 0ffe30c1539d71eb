"""``shardworker.testing.run_handler`` on handlers that sleep, wait for events, send them and
report progress: a run stops at a wait not yet ended (``suspended``, and what it waits on), and
goes past it when ``steps=`` holds the wait's end as the database records it."""

from __future__ import annotations

import pytest

from shardworker import App, EventTimeout, Job
from shardworker.errors import EventError
from shardworker.testing import run_handler, run_handler_async

app = App()


@app.handler("review")
def review(job: Job) -> dict[str, object]:
    job.progress("drafting")
    draft = job.step("draft", lambda: "v1")
    job.send_event("drafts", {"id": job.id})
    job.sleep("cool-off", 60)
    try:
        verdict = job.wait_event("verdict", f"review:{job.id}", timeout_s=3600)
    except EventTimeout:
        verdict = "no answer"
    job.progress("done")
    return {"draft": draft, "verdict": verdict}


def test_a_run_stops_at_its_first_wait_with_what_it_sent_and_reported() -> None:
    run = run_handler(app, "review", job_id=7)
    assert run.status == "suspended" and run.wait is not None
    assert (run.wait["kind"], run.wait["name"]) == ("sleep", "cool-off")
    assert run.steps == {"draft": "v1"} and run.events == [("drafts", {"id": 7})] and run.progress == ["drafting"]


def test_a_run_past_the_sleep_waits_for_its_event_then_ends_with_it_or_its_timeout() -> None:
    slept = {"draft": "v1", "cool-off": {"slept_until": 0}}
    run = run_handler(app, "review", job_id=7, steps=slept, attempt=2)
    assert run.status == "suspended" and run.wait is not None
    assert (run.wait["kind"], run.wait["key"]) == ("event", "review:7") and run.wait["until"] is not None
    ok = run_handler(app, "review", job_id=7, steps={**slept, "verdict": {"event": "ship it"}}, attempt=3)
    assert ok.status == "done" and ok.result == {"draft": "v1", "verdict": "ship it"}
    # The send before the sleep went with the run that reached the sleep: not carried again.
    assert ok.replayed == ["cool-off", "draft", "verdict"] and ok.events == []
    late = run_handler(app, "review", job_id=7, steps={**slept, "verdict": {"timeout": True}}, attempt=3)
    assert late.result == {"draft": "v1", "verdict": "no answer"}


def test_bad_waits_and_events_fail_the_run_with_one_line() -> None:
    bad = App()

    @bad.handler("key")
    def bad_key(job: Job) -> None:
        job.wait_event("w", "")

    @bad.handler("payload")
    def bad_payload(job: Job) -> None:
        job.send_event("k", {1, 2})

    @bad.handler("seconds")
    def bad_seconds(job: Job) -> None:
        job.sleep("s", -1)

    with pytest.raises(EventError, match="non-empty string"):
        run_handler(bad, "key")
    with pytest.raises(EventError, match="JSON-serializable"):
        run_handler(bad, "payload")
    with pytest.raises(ValueError, match="seconds >= 0"):
        run_handler(bad, "seconds")


def test_a_wait_ends_the_run_whoever_catches_or_wraps_it() -> None:
    """A bare except around a sleep, or a TaskGroup that wraps it in a BaseExceptionGroup: the run
    still ends at the wait, and nothing after it counts (the returned value is not the result)."""
    import asyncio

    odd = App()

    @odd.handler("swallow")
    def swallow(job: Job) -> str:
        try:
            job.sleep("s", 10)
        except BaseException:  # noqa: BLE001 (what a careless handler does)
            pass
        return "went on"

    @odd.handler("grouped")
    async def grouped(job: Job) -> str:
        async def nap() -> None:
            await job.sleep("s", 10)
        async with asyncio.TaskGroup() as group:
            group.create_task(nap())
            group.create_task(asyncio.sleep(5))
        return "went on"

    @odd.handler("finally")
    def unwinding(job: Job) -> None:
        try:
            job.sleep("s", 10)
        finally:  # runs as the wait unwinds the handler: none of it is this run's
            job.progress("cleaning up")
            job.step("cleanup", lambda: "cleaned")

    for kind in ("swallow", "grouped", "finally"):
        run = run_handler(odd, kind)
        assert run.status == "suspended" and run.wait is not None and run.wait["name"] == "s", kind
        assert run.steps == {} and run.progress == [], kind

    @odd.handler("after-catch")
    def after_catch(job: Job) -> str:
        try:
            job.sleep("s", 10)
        except BaseException:  # noqa: BLE001
            pass
        job.send_event("too-early", 1)
        return job.step("post", lambda: "ran")

    run = run_handler(odd, "after-catch")
    assert (run.status, run.steps, run.events) == ("suspended", {}, [])


def test_an_uncaught_timeout_fails_for_good_and_bad_progress_never_fails_a_job() -> None:
    """A recorded timeout would meet every retry at the same wait: the attempt fails for good.
    A progress value that cannot be shown is dropped with a warning, the job goes on."""
    import asyncio

    more = App()

    @more.handler("impatient")
    def impatient(job: Job) -> None:
        job.wait_event("w", "k", timeout_s=1)

    @more.handler("chatty")
    def chatty(job: Job) -> str:
        job.progress({1, 2})             # not JSON
        job.progress("x" * 10_000)       # over 8 KiB
        job.progress(float("nan"))
        job.progress("fine")
        return "done"

    @more.handler("awaiting")
    async def awaiting(job: Job) -> str:
        await job.progress("half")
        await job.send_event("k", 1)
        return "done"

    timed_out = run_handler(more, "impatient", steps={"w": {"timeout": True}}, raises=False)
    assert timed_out.status == "failed" and "fails for good" in (timed_out.error or "")
    assert run_handler(more, "chatty").progress == ["fine"]
    ran = asyncio.run(run_handler_async(more, "awaiting"))
    assert (ran.status, ran.progress, ran.events) == ("done", ["half"], [("k", 1)])
