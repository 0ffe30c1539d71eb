"""Outcomes set aside because their job does not exist here, tried again while that may change.

An outcome whose job the database does not have is kept whole in ``setaside.jsonl`` (never
dropped), with its record, so that it can land later. Usually the job was deleted, or the
outbox was pointed at another database, and it never will. But after the database went back
in time, the job may be a follow-up that another worker (or this one, from another shard, or
``outbox reapply`` on another host) is about to insert again with the id it had: then its
outcome lands as soon as the job is there, instead of the job running again. So the flusher
tries the kept ones again (``due``, ``retry``): every ``FAST_S`` for ``RECENT_S`` after one was
set aside (a re-apply is under way somewhere, or has just ended: a follow-up it inserted again
waits --rescue-grace before it may run, its kept outcome lands meanwhile), and every ``SLOW_S``
after that, for as long as the kept tail lasts
(``--reapply-window``, counted from when each was set aside). One that lands, or turns out to
be applied already, leaves the file; one whose job is now another attempt's goes to
``stale.jsonl``; the rest stay, and stop being tried once their window has passed.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
import os
import time
from collections.abc import Callable

import orjson

from outbox import atomic_write, read_small
from shardworker.core import layout, wire
from shardworker.core.model import ApplyResult, Outcome
from shardworker.flusher import kept

log = logging.getLogger(__name__)

FAST_S = 0.5  # for RECENT_S after one was set aside: a re-apply may be inserting its job any moment
SLOW_S = 30.0  # after that, while the window lasts (a host started later may insert it)
RECENT_S = 60.0


class SetAside:
    """The set-aside outcomes of one outbox directory (its flusher is their one writer)."""

    def __init__(self, directory: str, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.directory, self.window_s, self.clock = directory, window_s, clock
        self.last = float("-inf")  # when they were last tried: the first pass tries (a worker's start, a drain)
        self.waiting = window_s > 0  # whether the file may hold outcomes worth trying (within their window)
        self._recent_until = float("-inf")

    @property
    def recent(self) -> bool:
        """Whether one was set aside in the last ``RECENT_S`` (a re-apply may be under way)."""
        return self.clock() < self._recent_until

    def due(self) -> bool:
        """Whether to try again now."""
        return self.waiting and self.clock() - self.last >= (FAST_S if self.recent else SLOW_S)

    def kept_more(self) -> None:
        """Outcomes were just set aside: worth trying again, soon while a re-apply may be under way."""
        self.waiting = self.window_s > 0
        self._recent_until = self.clock() + RECENT_S

    def retry(self, apply: Callable[[list[Outcome]], ApplyResult]) -> ApplyResult:
        """Apply again (with ``apply``) the set-aside outcomes still within their window; keep
        what did not land."""
        self.last = self.clock()
        entries = self._entries()
        since = time.time() - self.window_s
        tried = [(n, outcome) for n, (entry, outcome) in enumerate(entries)
                 if outcome is not None and float(entry.get("at", 0)) >= since]  # type: ignore[arg-type]
        self.waiting = bool(tried)
        if not tried:
            return ApplyResult()
        result = apply([outcome for _, outcome in tried])
        gone = {(o.job_id, o.attempt) for _, o in tried} - set(self._still_missing(result, tried))
        if not gone:
            return result
        stale = [o for _, o in tried if o.job_id in set(result.stale_ids) and (o.job_id, o.attempt) in gone]
        if stale:
            kept.keep(layout.stale_log(self.directory), stale, "stale: a newer attempt owns the job (it ran again "
                      "before this outcome, set aside while its job was missing, could land)")
        left = [entry for entry, outcome in entries if outcome is None or (outcome.job_id, outcome.attempt) not in gone]
        atomic_write(self.directory, layout.SETASIDE_LOG, b"".join(orjson.dumps(e) + b"\n" for e in left))
        if result.applied:
            log.info("%d outcomes set aside while their jobs were missing have landed (inserted again since)",
                     result.applied)
        return result

    @staticmethod
    def _still_missing(result: ApplyResult, tried: list[tuple[int, Outcome]]) -> list[tuple[int, int]]:
        missing = set(result.missing_ids) | set(result.late_ids)
        return [(o.job_id, o.attempt) for _, o in tried if o.job_id in missing]

    def _entries(self) -> list[tuple[dict[str, object], Outcome | None]]:
        """Each line, and its outcome when it carries a decodable record."""
        try:
            text = read_small(os.path.join(self.directory, layout.SETASIDE_LOG))
        except FileNotFoundError:
            return []
        found: list[tuple[dict[str, object], Outcome | None]] = []
        for line in text.splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):
                entry = orjson.loads(line)
                if isinstance(entry, dict):
                    found.append((entry, _outcome(entry)))
        return found


def _outcome(entry: dict[str, object]) -> Outcome | None:
    record = entry.get("record")
    if not isinstance(record, str):
        return None  # a line written before records were kept: read by people only
    try:
        return wire.decode_outcome(base64.b64decode(record, validate=True))
    except (binascii.Error, ValueError, TypeError):
        return None
