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
from shardworker import wire
from shardworker.flusher.process import FlusherHandle, StopRequest
from shardworker.model import Outcome
from shardworker.store.pg_store import PgStore, StoreConfig
from tests.helpers import enqueue, query, wait_for, worker_config


def test_a_stop_is_not_answered_by_an_idle_flag_older_than_the_stop(pg_dsn: str, tmp_path: Path) -> None:
    """Idle, then frozen; a child's last outcome is committed and the stop asked: the flag
    still says idle, but no pass has seen that outcome. The stop must wait (not tell the
    flusher to exit) until the flusher, thawed, has applied it."""
    enqueue(pg_dsn, "k", 1)
    store = PgStore(StoreConfig(dsn=pg_dsn))
    try:
        [job] = store.claim(["k"], None, "w1", 1)
    finally:
        store.close()
    config = worker_config(dsn=pg_dsn, outbox_dir=str(tmp_path))
    handle = FlusherHandle(str(tmp_path), config.store_config(), config.flusher_config(), config.flush_idle_sleep_s)
    handle.start(fork=True)
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
