"""Telling children of cancelled jobs (``shardworker.worker.cancelling``): a job recalled from
a child and sent back to the same one is told again (issue 41, 6: it started anyway, then its
child was killed after the grace and its neighbours ran again)."""

from __future__ import annotations

from typing import Any

from shardworker.core import wire
from shardworker.core.model import ClaimedJob
from shardworker.worker.cancelling import Cancelling
from shardworker.worker.child_handle import Sent


class Child:
    """Stands in for a ``ChildHandle``: what it was sent, and the messages put to it."""

    def __init__(self) -> None:
        self.alive, self.process = True, object()
        self.sent: dict[wire.JobKey, Sent] = {}
        self.put_messages: list[Any] = []

    def put(self, message: Any) -> None:
        self.put_messages.append(message)


def test_a_cancelled_job_sent_back_to_the_same_child_is_told_again() -> None:
    job = ClaimedJob(7, "k", "default", "null", 1, 5)
    child, cancels = Child(), Cancelling(grace_s=10.0)
    child.sent[(7, 1)] = Sent(job, slot=0, size=4, at=1.0)
    cancels.add([(7, 1)])
    cancels.tell([child], now=2.0)  # type: ignore[list-item]
    assert child.put_messages == [wire.CancelJobs(((7, 1),))]
    cancels.tell([child], now=3.0)  # type: ignore[list-item]
    assert len(child.put_messages) == 1  # told once while it stays there
    del child.sent[(7, 1)]  # recalled (Returned): held in the parent, the child forgot it
    child.sent[(7, 1)] = Sent(job, slot=1, size=4, at=4.0)  # sent back to the same process
    cancels.tell([child], now=5.0)  # type: ignore[list-item]
    assert child.put_messages[1:] == [wire.CancelJobs(((7, 1),))]


def test_a_cancelled_job_waiting_in_the_parent_is_dropped_not_sent(tmp_path: Any) -> None:
    """A job the parent holds unsent (or took back from a child) that an operator cancels is
    never sent: the database says cancelled, and it never started."""
    from shardworker.app import App
    from shardworker.worker.pool import ChildPool
    from tests.helpers import child_config

    app = App()
    app.handler("k")(lambda job: None)
    pool = ChildPool([child_config(0, str(tmp_path))], app.handlers, max_jobs=8, max_bytes=1 << 20)
    waiting, other = ClaimedJob(7, "k", "default", "null", 1, 5), ClaimedJob(8, "k", "default", "null", 1, 5)
    pool.handles[0].held.extend([waiting, other])  # no child is up: they wait here
    assert pool.cancel({(7, 1)}) == 1
    assert list(pool.handles[0].held) == [other] and pool.job_keys() == [(8, 1)]
