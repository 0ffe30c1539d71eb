"""Other processes at the outbox: kill -9 of a writer process, and a second flusher or
writer in another process. Each checks exactly-once delivery of acknowledged records
(``tests.outbox.exactly_once``).
"""

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import outbox
from outbox import OutboxLocked, OutboxReader, ShardWriter
from outbox.segment import list_segments
from tests.outbox.exactly_once import PYTHONPATH, assert_exactly_once, read_ids

# --- kill -9 of a writer process -------------------------------------------------------------

CHILD_WRITER = """
import random, sys
from outbox import ShardWriter, WriterConfig
directory, base, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
w = ShardWriter.open(directory, 0, WriterConfig(segment_bytes=64 * 1024, reserve_bytes=0))
print("ready", flush=True)
n = base
while True:
    k = rng.randint(1, 40)
    print("attempt", n, n + k - 1, flush=True)
    for i in range(n, n + k):
        w.append({"id": i, "pad": "k" * rng.randint(0, 3000)})
    w.commit()
    print("ack", n, n + k - 1, flush=True)
    n += k
"""


def spawn(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": PYTHONPATH})


def ranges(lines: list[str], tag: str) -> set[int]:
    out: set[int] = set()
    for line in lines:
        parts = line.split()
        if line.endswith("\n") and len(parts) == 3 and parts[0] == tag:
            out.update(range(int(parts[1]), int(parts[2]) + 1))
    return out


def flush_once(reader: OutboxReader, max_records: int = 500) -> list[int]:
    """One flusher cycle: poll, 'commit' (return the ids), mark flushed, checkpoint."""
    records = reader.poll(max_records)
    reader.mark_flushed(records)
    reader.checkpoint()
    return [r.value()["id"] for r in records]  # type: ignore[index]


def test_kill_9_of_a_writer_loses_no_acknowledged_record(tmp_path):
    """Writers SIGKILLed at random instants while a flusher follows them, restarted each time:
    every acknowledged id is read exactly once, and nothing never attempted."""
    d, rng = str(tmp_path), random.Random(1234)
    attempted: set[int] = set()
    acked: set[int] = set()
    read: list[int] = []
    reader = OutboxReader.open(d)
    for round_ in range(15):
        child = spawn(CHILD_WRITER, d, str(round_ * 1_000_000), str(round_))
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        deadline = time.monotonic() + rng.uniform(0.0, 0.25)
        while time.monotonic() < deadline:
            if round_ % 2:  # the flusher reads the segment the writer is appending to
                read += flush_once(reader)
            else:
                time.sleep(0.002)
        child.send_signal(signal.SIGKILL)
        lines = child.stdout.readlines()
        child.wait()
        attempted |= ranges(lines, "attempt")
        acked |= ranges(lines, "ack")
        if round_ % 3 == 1:  # a flusher between rounds recovers the dead writer's shard itself
            read += flush_once(reader, 10**6)
        if round_ % 4 == 3:  # the flusher restarts too, from its checkpoint
            reader.close()
            reader = OutboxReader.open(d)
    assert len(acked) > 100, "the writer was killed before it acknowledged much: test proves little"
    ShardWriter.open(d, 0).close()  # the last restart: recovery of the last killed writer
    read += flush_once(reader, 10**6)
    reader.close()
    assert read_ids(d) == []  # everything was flushed and checkpointed: no replay
    assert_exactly_once(read, acked, attempted)
    assert outbox.verify(d).corrupt == []


# --- a second flusher -------------------------------------------------------------------------

CHILD_HOLDER = """
import sys
from outbox import OutboxReader, ShardWriter
directory, what = sys.argv[1], sys.argv[2]
held = OutboxReader.open(directory) if what == "flusher" else ShardWriter.open(directory, 5)
print("holding", flush=True)
sys.stdin.read()
held.close()
"""


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_second_flusher_in_another_process_is_refused(tmp_path, how):
    """While one process is the flusher, another's OutboxReader.open raises OutboxLocked; a
    clean exit or kill -9 of the holder frees the lock."""
    d = str(tmp_path)
    child = spawn(CHILD_HOLDER, d, "flusher")
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline() == "holding\n"
    with pytest.raises(OutboxLocked):
        OutboxReader.open(d)
    assert outbox.status(d).flusher_alive
    if how == "kill":
        child.kill()
    else:
        child.stdin.close()
    child.wait()
    OutboxReader.open(d).close()
    assert not outbox.status(d).flusher_alive


def test_a_second_writer_of_a_shard_in_another_process_is_refused(tmp_path):
    """A shard held by a writer in another process cannot be opened until that process dies."""
    d = str(tmp_path)
    child = spawn(CHILD_HOLDER, d, "writer")
    assert child.stdout is not None
    assert child.stdout.readline() == "holding\n"
    with pytest.raises(OutboxLocked):
        ShardWriter.open(d, 5)
    child.kill()
    child.wait()
    ShardWriter.open(d, 5).close()
    assert list_segments(d)[5] == [1, 2]
