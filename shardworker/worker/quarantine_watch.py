"""Jobs whose outcomes went down with a quarantined outbox segment, settled at once.

When the flusher finds corruption mid-run, it quarantines the segment: outcomes before the
damage were applied, the ones after it are unreadable. Their jobs would stay ``running``
under this worker for its whole life (and ``--exit-when-idle`` would never exit), to be
re-run only at its next start. The watch notices a new quarantined segment and requeues,
with the reason, every running job of this worker that no child still holds and no outbox
record still carries; each is logged to ``lost.jsonl`` and counted by ``outbox status``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import orjson

import outbox
from outbox import append_durably
from shardworker.core import layout, wire

log = logging.getLogger(__name__)

QUARANTINE_DIR = "quarantine"  # the outbox package's name for it


class LostStore(Protocol):
    def requeue_lost(self, worker_id: str, error: str, keep_ids: Sequence[int]) -> list[int]: ...


class QuarantineWatch:
    """Call ``run_once()`` from the dispatcher's loop; it looks at most every ``interval_s``."""

    def __init__(self, outbox_dir: str, worker_id: str, store: LostStore, still_coming: Callable[[], Iterable[int]],
                 *, interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.outbox_dir, self.worker_id, self.store = outbox_dir, worker_id, store
        self.still_coming, self.interval_s, self.clock = still_coming, interval_s, clock
        self._seen = set(self._quarantined())  # from before this run: startup recovery dealt with them
        self._next_at = 0.0

    def _quarantined(self) -> list[str]:
        path = os.path.join(self.outbox_dir, QUARANTINE_DIR)
        return sorted(os.listdir(path)) if os.path.isdir(path) else []

    def run_once(self) -> int | None:
        """Requeue the jobs lost with segments quarantined since the last look. None when there
        was none; else how many outcomes the outbox still holds (the rest are gone)."""
        now = self.clock()
        if now < self._next_at:
            return None
        self._next_at = now + self.interval_s
        new = [name for name in self._quarantined() if name not in self._seen]
        if not new:
            return None
        pending = pending_job_ids(self.outbox_dir)
        keep = set(self.still_coming()) | set(pending)
        reason = f"outcome lost: outbox segment {', '.join(new)} was corrupt and quarantined"
        requeued = self.store.requeue_lost(self.worker_id, reason, sorted(keep))
        self._seen.update(new)  # only once the requeue is done: a failed one is tried again
        if requeued:
            log.error("%d running jobs requeued: %s", len(requeued), reason)
            record_lost(self.outbox_dir, requeued, reason)
        return len(pending)


def pending_job_ids(outbox_dir: str) -> list[int]:
    """The jobs of the outcomes the outbox holds after its checkpoint (still coming, or just applied)."""
    ids = []
    for payload in outbox.pending_records(outbox_dir):
        with contextlib.suppress(ValueError, TypeError):
            ids.append(wire.outcome_key(payload)[0])
    return ids


def record_lost(outbox_dir: str, job_ids: list[int], reason: str) -> None:
    """Say in ``lost.jsonl`` which jobs were requeued because their outcome is gone, and why."""
    lines = b"".join(orjson.dumps({"at": time.time(), "job_id": i, "reason": reason}) + b"\n" for i in job_ids)
    try:
        append_durably(layout.lost_log(outbox_dir), lines)  # never through a symlink
    except OSError as exc:
        log.warning("could not record the requeued jobs in %s: %s", layout.LOST_LOG, exc)
