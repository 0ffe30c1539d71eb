"""The parent's stop of a real flusher process (``FlusherHandle.stop``): it ends the flusher
only once a pass that began after the stop was asked found nothing left. The flusher is frozen
(SIGSTOP) to hold it where a pass that read a shard before a child's last commit would be."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from outbox import ShardWriter
from outbox import status as outbox_status
from shardworker.core import wire
from shardworker.core.model import ClaimedJob, Outcome
from shardworker.flusher.process import FlusherHandle, StopRequest
from shardworker.store.pg_store import PgStore, StoreConfig
from tests.helpers import enqueue, query, wait_for, worker_config


def flusher_process(dsn: str, outbox_dir: Path) -> FlusherHandle:
    """A worker's flusher process on ``outbox_dir``, forked, with the defaults."""
    config = worker_config(dsn=dsn, outbox_dir=str(outbox_dir))
    handle = FlusherHandle(str(outbox_dir), config.store_config(), config.flusher_config(), config.flush_idle_sleep_s)
    handle.start(fork=True)
    return handle


def test_a_stop_is_not_answered_by_an_idle_flag_older_than_the_stop(pg_dsn: str, tmp_path: Path) -> None:
    """Idle, then frozen; a child's last outcome is committed and the stop asked: the flag
    still says idle, but no pass has seen that outcome. The stop must wait (not tell the
    flusher to exit) until the flusher, thawed, has applied it."""
    [job] = claim(pg_dsn, 1)
    handle = flusher_process(pg_dsn, tmp_path)
    try:
        wait_for(lambda: handle.idle, 30, "the flusher idle", step_s=0.02)
        os.kill(handle.process.pid, signal.SIGSTOP)
        try:
            with ShardWriter.open(str(tmp_path), 0) as writer:
                writer.append_bytes(wire.encode_outcome(Outcome.done(job.id, job.attempt, b"1")))
                writer.commit()
            stopping = threading.Thread(target=handle.stop, args=(time.monotonic() + 30,))
            stopping.start()
            time.sleep(0.5)
            assert handle.state.stop != StopRequest.NOW, "the stop trusted an idle flag older than itself"
        finally:
            os.kill(handle.process.pid, signal.SIGCONT)
        stopping.join(30)
        assert not stopping.is_alive() and not handle.alive
    finally:
        handle.kill()
    assert query(pg_dsn, "SELECT status FROM shardworker.jobs WHERE id = %s", job.id) == [("done",)]


def claim(dsn: str, count: int) -> list[ClaimedJob]:
    enqueue(dsn, "k", count)
    store = PgStore(StoreConfig(dsn=dsn))
    try:
        return store.claim(["k"], None, "w1", count)
    finally:
        store.close()


def claimed_with_outcomes_in_the_outbox(dsn: str, outbox_dir: Path, count: int) -> list[ClaimedJob]:
    """``count`` jobs claimed by w1, their outcomes committed in shard 0 (none applied yet)."""
    jobs = claim(dsn, count)
    with ShardWriter.open(str(outbox_dir), 0) as writer:
        for job in jobs:
            writer.append_bytes(wire.encode_outcome(Outcome.done(job.id, job.attempt, b"1")))
        writer.commit()
    return jobs


def test_a_stop_applies_more_than_a_batch_before_ending_the_flusher(pg_dsn: str, tmp_path: Path) -> None:
    """2,500 outcomes wait when the stop comes (an outage just ended, say): more than one batch
    (flush_batch 1,000). A batch that ends on a due checkpoint leaves nothing held and nothing
    dirty, yet is no proof that nothing is left: the stop must wait for a pass that found
    nothing, and every outcome lands. (Found by a review: 2,000 of 2,500 applied.)"""
    handle = flusher_process(pg_dsn, tmp_path)
    try:
        wait_for(lambda: handle.idle, 30, "the flusher idle", step_s=0.02)
        os.kill(handle.process.pid, signal.SIGSTOP)
        try:
            claimed_with_outcomes_in_the_outbox(pg_dsn, tmp_path, 2500)
            stopping = threading.Thread(target=handle.stop, args=(time.monotonic() + 60,))
            stopping.start()
            time.sleep(0.3)
        finally:
            os.kill(handle.process.pid, signal.SIGCONT)
        stopping.join(70)
    finally:
        handle.kill()
    assert query(pg_dsn, "SELECT status, count(*) FROM shardworker.jobs GROUP BY status") == [("done", 2500)]
    assert outbox_status(str(tmp_path)).pending == 0


def test_drained_at_start_means_every_pending_outcome_applied(pg_dsn: str, tmp_path: Path) -> None:
    """A restart finds 12,000 outcomes in the outbox. Startup recovery waits for the flusher to
    say it has drained them, then requeues this worker's running jobs as orphans: a drained
    said after a batch that ended on a due checkpoint had the jobs of the outcomes still
    waiting requeued, charged, to run again (found by a review: 11,000 of 20,000)."""
    claimed_with_outcomes_in_the_outbox(pg_dsn, tmp_path, 12000)
    handle = flusher_process(pg_dsn, tmp_path)
    try:
        wait_for(lambda: handle.drained, 60, "the flusher drained", step_s=0.001)
        assert query(pg_dsn, "SELECT status, count(*) FROM shardworker.jobs GROUP BY status") == [("done", 12000)]
        assert outbox_status(str(tmp_path)).pending == 0
    finally:
        handle.kill()
