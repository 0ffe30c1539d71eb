"""A reader waits on its wake socket and a writer's commit wakes it (``outbox.wake``), from
another process; a directory too deep for a socket path falls back to sleeping; nothing
listening never fails a commit."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

from outbox import OutboxReader, ShardWriter
from outbox.wake import WAKE_SOCKET


def commit_one(directory: str) -> None:
    with ShardWriter.open(directory, 0) as writer:
        writer.append_bytes(b"hello")
        writer.commit()


def test_a_commit_in_another_process_wakes_the_waiting_reader(tmp_path: Path) -> None:
    reader = OutboxReader.open(str(tmp_path))
    try:
        assert reader.waking and oct(os.stat(tmp_path / WAKE_SOCKET).st_mode & 0o777) == "0o600"
        assert reader.wait(0.05) is False  # nothing committed: the timeout
        writer = multiprocessing.get_context("spawn").Process(target=commit_one, args=(str(tmp_path),))
        writer.start()
        started = time.monotonic()
        assert reader.wait(30) is True
        assert time.monotonic() - started < 25  # woken by the commit, not by the timeout
        writer.join(30)
        assert [r.payload for r in reader.poll(10)] == [b"hello"]
    finally:
        reader.close()
    commit_one(str(tmp_path))  # the socket file stays, nobody listens: the commit goes through
    again = OutboxReader.open(str(tmp_path))  # and the next reader replaces it
    try:
        assert again.waking and [r.payload for r in again.poll(10)] == [b"hello", b"hello"]
    finally:
        again.close()


def test_no_reader_never_fails_a_commit_and_a_deep_directory_polls(tmp_path: Path) -> None:
    commit_one(str(tmp_path))  # nobody listens
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    reader = OutboxReader.open(str(deep))
    try:
        assert not reader.waking and not (deep / WAKE_SOCKET).exists()
        commit_one(str(deep))
        assert reader.wait(0.01) is False and len(reader.poll(10)) == 1
    finally:
        reader.close()
