"""The dispatcher's backlog counts step records (the flusher counts every record it flushes),
with the dispatcher's loop driven as tests/worker/dispatcher_harness.py drives it."""

from __future__ import annotations

from pathlib import Path

from shardworker.core.jobstats import STEP_RECORDED, summarize
from shardworker.worker.deaths import Death
from tests.flaky_store import FlakyStore
from tests.helpers import enqueue
from tests.worker.dispatcher_harness import make, store

__all__ = ["store"]  # the fixture, shared


def test_step_records_count_in_the_flushers_backlog(pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """The flusher counts every record it flushes, steps too: steps the children recorded and
    steps carried over from a dead child are part of the backlog, so claims pause for them."""
    enqueue(pg_dsn, "k", 40)
    dispatcher, children, flusher, _ = make(store, tmp_path, procs=1, max_backlog=10, claim_batch=20, prefetch=20)
    dispatcher.run_once()
    children.job_counts.add(summarize([("k", STEP_RECORDED, -1.0)] * 8))
    children.deaths.append(Death(0, "worker process died (exit code -9)", 0, (), (), steps=(b"s",) * 3))
    dispatcher.run_once()
    assert dispatcher.backlog() == 11 and "behind" in dispatcher.pause_reason
    flusher.flushed_total = 11
    dispatcher.run_once()
    assert dispatcher.backlog() == 0
