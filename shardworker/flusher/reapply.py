"""``outbox reapply``: after a restore from a backup, apply again what the outbox keeps and the
database lost, on a host whose worker is stopped.

A worker finds a database that went back in time by itself (``shardworker.flusher.marks``),
and so does ``outbox drain``; this is the explicit form, run on each host after a restore,
with a dry run. It re-applies every kept record past the position the restored database holds
(or every kept record, ``from_start``: the marks table itself may be from before the outbox's
first batch), through the usual fences, then does what a drain does (``shardworker.worker.drain``).

The dry run (``preview``) reads the same records and asks the database, read only, which rows
they would change now (``job_apply_preview``, the apply's own fence): the outcomes that would
land, plus those of follow-ups that landing parents would insert again with their ids
(``shardworker.flusher.journal``). Nothing is written, and the outbox's positions stay.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from outbox import Keep, OutboxLocked, Position
from shardworker.core import binding, layout, wire
from shardworker.core.config import FlusherConfig
from shardworker.core.followups import decode as decode_followups
from shardworker.core.model import Outcome, ProgressRecord, StepRecord
from shardworker.core.retry import Backoff, retry_call
from shardworker.errors import NewerRecord, OutboxBusy
from shardworker.flusher.journal import Journal
from shardworker.flusher.process import marks_for, open_reader
from shardworker.store.pg_store import PgStore, StoreConfig

log = logging.getLogger(__name__)
PREVIEW_BATCH = 5000  # kept records read, and asked about, at a time
KEEP_ALL = Keep(seconds=float("inf"), max_bytes=1 << 62)  # a dry run deletes nothing


@dataclass(frozen=True)
class Preview:
    """What ``outbox reapply`` would do now."""

    records: int  # kept records past the database's mark (outcomes and steps)
    outcomes: int
    jobs_changed: int  # jobs whose outcome would land (theirs, or as a follow-up inserted again)
    followups: int  # follow-up jobs that would be inserted again
    steps: int  # step records among them (each recorded once, if not already)


def preview(outbox_dir: str, dsn: str, *, from_start: bool = False, timeout_s: float = 60.0) -> Preview:
    """Read, without applying, what ``outbox reapply`` would apply, and count what it would change."""
    if not layout.holds_an_outbox(outbox_dir):
        raise OutboxBusy(f"no outbox at {outbox_dir}: nothing to re-apply")
    lock_fd = layout.lock_outbox(outbox_dir, "reapply")
    try:
        try:
            reader = open_reader(outbox_dir, wait_s=0, keep=KEEP_ALL)
        except OutboxLocked as exc:
            raise OutboxBusy(f"a flusher holds the outbox {outbox_dir}") from exc
        store = PgStore(StoreConfig(dsn=dsn))
        try:
            backoff = Backoff(0.05, 2.0)
            retry_call(lambda: binding.bind(outbox_dir, store), "checking which database the outbox belongs to",
                       backoff=backoff, log=log, deadline=_deadline(timeout_s))
            marks = marks_for(reader, store, FlusherConfig(flush_batch=1, flush_bytes=1, checkpoint_interval_s=1.0,
                                                           backoff_base_s=0.05, backoff_cap_s=1.0))
            found = retry_call(lambda: store.read_mark(marks.outbox_id), "reading the outbox's mark",
                               backoff=backoff, log=log, deadline=_deadline(timeout_s))
            held = {} if found is None or from_start else found.positions
            reader.rewind({shard: Position(*held[shard]) if shard in held else None
                           for shard in reader.shards_on_disk()})
            records = steps = 0
            outcomes: list[Outcome] = []
            landing: set[int] = set()
            while batch := reader.poll(PREVIEW_BATCH):  # a batch at a time: the kept tail may be large
                decoded = [_decode(r.payload, outbox_dir) for r in batch]
                part = [d for d in decoded if isinstance(d, Outcome)]
                records, steps = records + len(batch), steps + sum(isinstance(d, StepRecord) for d in decoded)
                landing |= retry_call(lambda part=part: store.preview_outcomes(part), "asking which outcomes would "
                                      "land", backoff=backoff, log=log, deadline=_deadline(timeout_s))
                outcomes += [o for o in part if o.followups_json or o.job_id in landing]
            return _count(outbox_dir, outcomes, landing, records, steps)
        finally:
            store.close()
            reader.close()  # no checkpoint: the outbox's positions are as they were
    finally:
        os.close(lock_fd)


def _count(outbox_dir: str, outcomes: list[Outcome], landing: set[int], records: int, steps: int) -> Preview:
    """Landing outcomes, and the follow-ups their parents would insert again (with the ids
    they had, so that their own kept outcomes land too)."""
    known = Journal(outbox_dir, 0.0).load()
    again: set[int] = set()
    followups = 0
    for outcome in outcomes:
        if outcome.job_id in landing and outcome.followups_json:
            ids = known.get((outcome.job_id, outcome.attempt), ())
            followups += len(ids) or len(decode_followups(outcome.followups_json))
            again.update(i for i in ids if i is not None)
    changed = {o.job_id for o in outcomes if o.job_id in landing or o.job_id in again}
    return Preview(records, len(outcomes), len(changed), followups, steps)


def _decode(payload: bytes, outbox_dir: str) -> Outcome | StepRecord | ProgressRecord | None:
    """A kept record, or None for one that is not ours (a drain dead-letters it; a dry run skips
    it); a record of a newer release is refused, as the drain does."""
    try:
        return wire.decode_record(payload)
    except NewerRecord as exc:
        raise NewerRecord(f"the outbox {outbox_dir} holds a record written by a newer shardworker ({exc}): run that "
                          "release, or a later one, to re-apply it") from None
    except (ValueError, TypeError):
        return None


def _deadline(timeout_s: float) -> float:
    return time.monotonic() + timeout_s
