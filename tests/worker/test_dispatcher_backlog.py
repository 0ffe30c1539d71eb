"""``Dispatcher.run_once`` and the backlog it keeps (records durable, not yet flushed):
claims pause while the flusher is behind, an idle worker exits once nothing is held, and a
count that drifted high is recounted from the outbox."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.flaky_store import FlakyStore
from tests.helpers import enqueue, query
from tests.worker.dispatcher_harness import make


def test_claiming_pauses_while_the_flusher_is_behind(pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """With more than max_backlog outcomes durable but not flushed, nothing is claimed until it catches up."""
    enqueue(pg_dsn, "k", 40)
    dispatcher, children, flusher, _ = make(store, tmp_path, procs=1, max_backlog=10, claim_batch=20,
                                            prefetch=20)
    dispatcher.run_once()
    children.finish(0, 20)
    flusher.idle = False  # a real flusher has the 20 to apply (this stand-in writes no outbox)
    dispatcher.run_once()  # counts 20 finished: the backlog is 20 > 10
    claimed = dispatcher.claimed_total
    dispatcher.run_once()
    assert dispatcher.claimed_total == claimed and "behind" in dispatcher.pause_reason
    flusher.flushed_total = 20
    dispatcher.run_once()
    assert dispatcher.claimed_total == 40


def test_exit_when_idle_once_nothing_is_due_or_held(pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """With exit_when_idle, run_once says stop only when no job is due or in flight and the outbox is empty."""
    enqueue(pg_dsn, "k", 2)
    dispatcher, children, flusher, clock = make(store, tmp_path, procs=1, exit_when_idle=True)
    assert dispatcher.run_once() is False  # claims the two
    clock.now += 1
    assert dispatcher.run_once() is False  # they are in flight
    children.finish(0, 2)
    query(pg_dsn, "UPDATE shardworker.jobs SET status = 'done', locked_by = NULL RETURNING id")
    dispatcher.run_once()
    flusher.flushed_total = 2
    clock.now += 1
    assert dispatcher.run_once() is True


def test_a_backlog_counted_too_high_is_recounted_once_the_outbox_is_empty(
        pg_dsn: str, store: FlakyStore, tmp_path: Path) -> None:
    """The backlog is an estimate: a quarantine recounts it from the outbox's files while the
    flusher goes on applying, and a record applied in between is counted as still to come
    (seen in a clean-clone run: "outbox backlog 319" forever, the worker never exiting when
    idle). With nothing in flight, the flusher idle and the outbox empty on disk, the
    dispatcher knows the backlog is 0: claims resume and an idle worker exits."""
    enqueue(pg_dsn, "k", 2)
    dispatcher, children, flusher, clock = make(store, tmp_path, procs=1, exit_when_idle=True, max_backlog=10)
    dispatcher.run_once()
    children.finish(0, 2)
    query(pg_dsn, "UPDATE shardworker.jobs SET status = 'done', locked_by = NULL RETURNING id")
    dispatcher.run_once()
    flusher.flushed_total = 2
    dispatcher.backlog.add(319)  # what the race leaves: records counted that the flusher already applied
    clock.now += 1
    assert dispatcher.run_once() is True
    assert dispatcher.backlog() == 0
    assert "behind" not in dispatcher.pause_reason


def test_outcomes_applied_before_their_report_arrives_leave_no_negative_backlog(
        pg_dsn: str, store: FlakyStore, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A child commits an outcome, then reports it; the flusher can apply it before the parent
    reads that report (seen by a new user: "outbox backlog -2" in the progress line). Nothing
    is behind then: the backlog is 0, in the progress line too, not negative."""
    enqueue(pg_dsn, "k", 2)
    dispatcher, _children, flusher, clock = make(store, tmp_path, procs=1, log_interval_s=1.0)
    dispatcher.run_once()
    flusher.flushed_total = 2  # applied; the children's reports not read yet
    assert dispatcher.backlog() == 0
    clock.now += 2
    with caplog.at_level(logging.INFO):
        dispatcher.run_once()
    assert "outbox backlog 0" in caplog.text and "backlog -" not in caplog.text
