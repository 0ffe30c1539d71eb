"""The committer's step path: a handler thread commits its own step record (no hop to the
committer's thread and back), and threads that wait behind a running commit share the next."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from outbox import ShardWriter
from outbox.inspect import pending_records
from shardworker.child.committer import Committer


class CountingWriter:
    """A real shard writer whose commits are counted, and slowed so that threads queue behind them."""

    def __init__(self, writer: ShardWriter, commit_s: float = 0.0) -> None:
        self.writer, self.commit_s, self.commits = writer, commit_s, 0

    def append_bytes(self, record: bytes) -> None:
        self.writer.append_bytes(record)

    def commit(self) -> None:
        time.sleep(self.commit_s)
        self.writer.commit()
        self.commits += 1

    def reclaim(self) -> bool:
        return self.writer.reclaim()


def test_a_step_is_committed_on_its_handlers_thread_even_with_the_committer_thread_not_running(tmp_path: Path) -> None:
    writer = ShardWriter.open(str(tmp_path), 0)
    committer = Committer(writer, lambda keys, stats: None, max_records=100, max_delay_s=0.05)  # never started
    committer.commit_step(b"step-1")
    committer.commit_step(b"step-2")
    writer.close()
    assert pending_records(str(tmp_path)) == [b"step-1", b"step-2"]


def test_threads_waiting_for_steps_share_commits_and_every_record_lands_once_in_order(tmp_path: Path) -> None:
    writer = CountingWriter(ShardWriter.open(str(tmp_path), 0), commit_s=0.002)
    reported: list[tuple[int, int]] = []
    committer = Committer(writer, lambda keys, stats: reported.extend(keys),  # type: ignore[arg-type]
                          max_records=1000, max_delay_s=0.05)
    committer.start()
    threads, per_thread, outcomes = 8, 40, 100
    committer.expect(outcomes)

    def steps(t: int) -> None:
        for i in range(per_thread):
            committer.commit_step(f"step {t} {i}".encode())

    def finish_jobs() -> None:
        for i in range(outcomes):
            committer.add((i, 1), f"outcome {i}".encode(), time.monotonic())

    workers = [threading.Thread(target=steps, args=(t,)) for t in range(threads)]
    workers.append(threading.Thread(target=finish_jobs))
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    committer.stop()
    writer.writer.close()
    records = [r.decode() for r in pending_records(str(tmp_path))]
    assert len(records) == len(set(records)) == threads * per_thread + outcomes
    for t in range(threads):
        assert [r for r in records if r.startswith(f"step {t} ")] == [f"step {t} {i}" for i in range(per_thread)]
    assert [r for r in records if r.startswith("outcome")] == [f"outcome {i}" for i in range(outcomes)]
    assert sorted(reported) == [(i, 1) for i in range(outcomes)]
    assert writer.commits <= threads * per_thread / 2, f"{writer.commits} commits: waiting threads did not share"
