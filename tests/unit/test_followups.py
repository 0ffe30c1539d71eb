"""``job.enqueue`` before anything reaches the database: follow-ups are validated as
``enqueue`` validates, handles resolve within their own run only, a dedupe key repeated in
one run is one job, and the limits refuse with a clear error."""

from __future__ import annotations

import orjson
import pytest

from shardworker.child.followups import FollowUps
from shardworker.core import followups
from shardworker.core.model import ClaimedJob
from shardworker.errors import EnqueueError


def add(run: FollowUps, kind: str = "k", **options: object) -> followups.FollowUp:
    fields = {"queue": "default", "priority": 0, "delay_s": 0.0, "max_attempts": 25, "dedupe_key": None,
              "after": (), **options}
    return run.add(kind, None, **fields)  # type: ignore[arg-type]


def test_handles_become_references_and_round_trip_through_the_record() -> None:
    run = FollowUps()
    first, second = add(run), add(run, "other", queue="q", priority=3, delay_s=1.5)
    add(run, "merge", after=[first, second, 7, first])
    rows = followups.decode(run.encode() or b"")
    assert [r.kind for r in rows] == ["k", "other", "merge"]
    assert rows[1].queue == "q" and rows[1].priority == 3 and rows[1].delay_s == 1.5
    assert rows[2].after == (-1, -2, 7)  # repeats dropped, handles as -(index + 1)


def test_bad_follow_ups_are_refused_at_the_call() -> None:
    run, other = FollowUps(), FollowUps()
    with pytest.raises(EnqueueError, match="kind must be a non-empty string"):
        add(run, "")
    with pytest.raises(EnqueueError, match="enqueued by another run"):
        add(run, after=[add(other)])
    with pytest.raises(EnqueueError, match="is not a job id"):
        add(run, after=[0])
    with pytest.raises(EnqueueError, match="after must be a list"):
        add(run, after=add(run))
    with pytest.raises(EnqueueError, match="payload is not JSON-serializable"):
        run.add("k", object(), queue="default", priority=0, delay_s=0.0, max_attempts=25, dedupe_key=None, after=())
    assert len(run) == 1  # only the handle made for the misuse above


def test_one_dedupe_key_twice_in_a_run_is_one_job() -> None:
    run = FollowUps()
    assert add(run, dedupe_key="a") is add(run, dedupe_key="a")
    assert len(run) == 1


def test_beyond_the_limits_enqueue_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shardworker.child.followups.MAX_FOLLOWUPS", 3)
    run = FollowUps()
    for _ in range(3):
        add(run)
    with pytest.raises(EnqueueError, match="more than 3 follow-up jobs in one run"):
        add(run)
    monkeypatch.setattr("shardworker.child.followups.MAX_FOLLOWUP_BYTES", 100)
    with pytest.raises(EnqueueError, match="exceed 100 bytes"):
        FollowUps().add("k", "x" * 200, queue="default", priority=0, delay_s=0.0, max_attempts=25, dedupe_key=None,
                        after=())


def test_a_claimed_job_hands_its_dependencies_by_integer_id() -> None:
    job = ClaimedJob(5, "merge", "default", "{}", 1, 25, None, orjson.dumps({"3": {"t": 1}, "4": None}).decode())
    assert job.to_job().dependencies == {3: {"t": 1}, 4: None}
    assert ClaimedJob(6, "k", "default", "{}", 1, 25).to_job().dependencies == {}
    with pytest.raises(RuntimeError, match="inside a worker's handler only"):
        job.to_job().enqueue("k")
