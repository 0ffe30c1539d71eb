"""The ids follow-up jobs got, kept beside the outbox for as long as the applied tail.

A follow-up's id is drawn by the database when its parent's outcome is applied; a database
that goes back in time loses the insert with the outcome. Applied again from the kept tail,
the outcome inserts its follow-ups again, and they must get the ids they had: their own
outcomes (kept here or in another worker's outbox) name them by those ids. So after every
batch that inserted follow-ups the flusher appends, per parent run, the ids they got
(``followups.jsonl``: {"at", "job", "attempt", "ids"}), made durable with the checkpoint that
follows (a crash before it loses only ids of the last moments, and only if the database then
goes back too: those follow-ups get new ids, and run again). Lines older than the kept window
go when the file has grown past ``PRUNE_BYTES`` and doubled since it was last pruned (a
rewrite at every checkpoint would cost more than the batches).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

import orjson

from outbox import NOFOLLOW, atomic_write, read_small
from shardworker.core.layout import FOLLOWUPS_JOURNAL

log = logging.getLogger(__name__)

PRUNE_BYTES = 4 * 1024 * 1024  # past this, lines older than the window are dropped (rewritten whole)

Run = tuple[int, int]  # (parent job id, attempt)


class Journal:
    """Append-only, one writer: the outbox's flusher (it holds the flusher lock)."""

    def __init__(self, directory: str, window_s: float) -> None:
        self.directory, self.window_s = directory, window_s
        self.path = os.path.join(directory, FOLLOWUPS_JOURNAL)
        self._fd: int | None = None
        self._unsynced = False
        self._prune_at = PRUNE_BYTES  # the size at which the next prune is due

    def record(self, made: tuple[tuple[int, int, tuple[int | None, ...]], ...]) -> None:
        """The ids the follow-ups of these parent runs got (synced at the next ``sync``)."""
        if not made or self.window_s <= 0:
            return
        now = time.time()
        lines = b"".join(orjson.dumps({"at": now, "job": job, "attempt": attempt, "ids": list(ids)}) + b"\n"
                         for job, attempt, ids in made)
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW | os.O_CLOEXEC, 0o600)
            os.write(self._fd, lines)
            self._unsynced = True
        except OSError as exc:  # only a help for a database that goes back: never worth a batch
            log.warning("could not note follow-up ids in %s: %s", FOLLOWUPS_JOURNAL, exc)

    def sync(self) -> None:
        """Make what was noted durable (before the checkpoint); drop old lines past ``PRUNE_BYTES``."""
        if self._fd is not None and self._unsynced:
            try:
                os.fdatasync(self._fd)
                self._unsynced = False
                if os.fstat(self._fd).st_size > self._prune_at:
                    self._prune()
            except OSError as exc:
                log.warning("could not sync %s: %s", FOLLOWUPS_JOURNAL, exc)

    def load(self) -> dict[Run, tuple[int | None, ...]]:
        """Every run's follow-up ids still noted (the newest of each run)."""
        found: dict[Run, tuple[int | None, ...]] = {}
        for entry in self._entries():
            with contextlib.suppress(KeyError, TypeError, ValueError):
                found[(int(entry["job"]), int(entry["attempt"]))] = tuple(
                    None if i is None else int(i) for i in entry["ids"])
        return found

    def _entries(self) -> list[dict[str, object]]:
        try:
            text = read_small(self.path)
        except FileNotFoundError:
            return []
        entries = []
        for line in text.splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):  # a line torn by a crash: that run's ids are lost
                entry = orjson.loads(line)
                if isinstance(entry, dict):
                    entries.append(entry)
        return entries

    def _prune(self) -> None:
        since = time.time() - self.window_s
        kept = [e for e in self._entries() if isinstance(e.get("at"), int | float) and e["at"] >= since]  # type: ignore[operator]
        self.close()
        text = b"".join(orjson.dumps(e) + b"\n" for e in kept)
        atomic_write(self.directory, FOLLOWUPS_JOURNAL, text)
        self._prune_at = max(PRUNE_BYTES, 2 * len(text))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
