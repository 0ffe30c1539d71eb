"""The power-loss workload: ``Workload`` drives writers and a reader through random steps
on the fault layer (``tests.outbox.faultfs``) until the power cut; ``kill`` is what kill -9
leaves of a writer."""


import errno
import os
import random

from outbox import OutboxError, OutboxReader, OutboxSyncError, ShardWriter
from tests.outbox.exactly_once import SMALL, drain
from tests.outbox.faultfs import Died


def kill(writer: ShardWriter) -> None:
    """What kill -9 leaves of a writer: its fds closed, no seal, no cleanup."""
    for fd in (writer._fd, writer._lock_fd):
        if fd is not None:
            os.close(fd)


class Workload:
    """Random appends, commits, writer restarts and flusher checkpoints on two shards.

    A ``Died`` from the file layer kills the whole worker (writers and flusher) and starts a
    new one, which recovers; so does an I/O error (an fsync EIO: exit, and let the restart
    recover, as the durability rules allow). A ``Crash`` ends the run.
    """

    def __init__(self, directory: str, rng: random.Random) -> None:
        self.directory, self.rng = directory, rng
        self.attempted: set[int] = set()
        self.acked: set[int] = set()
        self.checkpointed: set[int] = set()  # flushed, and a checkpoint() after it returned
        self.maybe_checkpointed: set[int] = set()  # flushed, in a checkpoint() that was cut short
        self.writers: dict[int, ShardWriter] = {}
        self.reader: OutboxReader | None = None
        self._next = 0

    def run(self, steps: int) -> None:
        self._start()
        for _ in range(steps):
            try:
                self._one_step()
            except (Died, OSError, OutboxError) as exc:
                self._die(exc)
                self._start()

    def _start(self) -> None:
        while True:
            try:
                for shard in (0, 1):
                    if shard not in self.writers:
                        self.writers[shard] = ShardWriter.open(self.directory, shard, SMALL)
                if self.reader is None:
                    self.reader = OutboxReader.open(self.directory)
                return
            except (Died, OSError, OutboxError) as exc:
                self._die(exc)

    def _die(self, exc: BaseException) -> None:
        """The worker dies of a kill or an injected EIO; any other error is a bug and propagates."""
        eio = isinstance(exc, OutboxSyncError) or (isinstance(exc, OSError) and exc.errno == errno.EIO)
        if not (eio or isinstance(exc, Died)):
            raise exc
        self._kill_all()

    def _kill_all(self) -> None:
        for w in self.writers.values():
            kill(w)
        self.writers = {}
        if self.reader is not None:
            self.reader.close()  # closes fds only
            self.reader = None

    def _one_step(self) -> None:
        roll, shard = self.rng.random(), self.rng.choice((0, 1))
        if roll < 0.65:
            self._commit(shard, self.rng.randint(1, 12))
        elif roll < 0.85:
            self._flush()
        else:
            self.writers.pop(shard).close()
            self.writers[shard] = ShardWriter.open(self.directory, shard, SMALL)

    def _commit(self, shard: int, n: int) -> None:
        ids = list(range(self._next, self._next + n))
        self._next += n
        self.attempted.update(ids)
        for i in ids:
            self.writers[shard].append({"id": i, "pad": "p" * self.rng.randint(0, 300)})
        self.writers[shard].commit()
        self.acked.update(ids)

    def _flush(self) -> None:
        assert self.reader is not None
        records = drain(self.reader)
        done = records[: self.rng.randint(0, len(records))]
        self.reader.mark_flushed(done)
        ids = {r.value()["id"] for r in done}  # type: ignore[index]
        self.maybe_checkpointed |= ids
        self.reader.checkpoint()
        self.checkpointed |= ids
        self.maybe_checkpointed -= ids
        # What was polled but not marked stays in flight; a new reader would replay it, so
        # drop this reader's memory of it by reopening.
        self.reader.close()
        self.reader = None
        self.reader = OutboxReader.open(self.directory)

    def abandon(self) -> None:
        """After the power cut: close every fd, running no outbox code that writes."""
        for w in self.writers.values():
            kill(w)
        if self.reader is not None:
            self.reader.close()
