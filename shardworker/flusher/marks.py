"""A database that comes back older: the flusher's mark, and applying the kept tail again.

A database can come back older than what the flusher saw it commit: a failover to an
asynchronous replica that lagged, a restore from a backup. The outcomes, steps and follow-ups
of that stretch are gone from it, and so are the claims: a job that ran and whose outcome
landed is queued again, or still running for a worker that believes it done. Applied records
stay in the outbox for a while (``run --reapply-window``: the kept tail, ``outbox.tail``) so
they can land again.

Every batch carries the outbox's mark (``shardworker.outbox_marks``: a count of batches and
each shard's position after its last record), checked and written in the batch's own
transaction: the database must hold at least the batch the flusher last saw committed, else
the transaction fails (``DatabaseWentBack``) and nothing of it lands. The same check runs by
itself when the worker asks (``check``: after it reached a new server, before it claims).
When the database went back (``went_back``), the flusher

1. holds every worker's claims (``claim_holds``): a claim lost with the rest could be made
   again, and its job run again, before its kept outcome lands;
2. rewinds its reader to the positions the database holds, into the kept tail, and applies
   everything from there again through the usual fences: an outcome lands on a row that went
   back to before its claim, on that claim's job only (``job_apply_outcomes``), steps and
   follow-ups once;
3. lets claims go once it has passed the positions it had reached (``progress``); a re-apply
   that makes no progress for a while (a row locked for good, a record of a newer release)
   lets its hold lapse, with an ERROR, rather than stop every worker's claims for good.

What the kept tail no longer holds (the database went back further than the window) cannot
land again: it is said at ERROR, and those jobs run again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from outbox import OutboxReader, Position, Record
from shardworker.core.model import Mark, Outcome
from shardworker.flusher.journal import Journal

log = logging.getLogger(__name__)

HOLD_S = 30.0  # a re-applying flusher's hold on claims, moved on while it works (a dead one's lapses)
HOLD_RENEW_S = 10.0
# Once done, the hold stays this much longer: another worker's outcomes of follow-ups this one
# has just inserted again (deferred there while they were missing: Flusher) land before any claim.
REAPPLIED_GRACE_S = 2.0


class MarkStore(Protocol):
    """What the marks need from a store (``PgStore`` provides it)."""

    def check_mark(self, outbox_id: str, expect: int) -> int: ...
    def read_mark(self, outbox_id: str) -> tuple[int, dict[int, tuple[int, int, int]]] | None: ...
    def hold_claims(self, holder: str, reason: str, seconds: float) -> None: ...
    def release_claims(self, holder: str) -> None: ...
    def claim_holds(self) -> list[tuple[str, str, float]]: ...


class Marks:
    """The mark of one outbox, as its flusher knows it committed, and a re-apply in progress."""

    def __init__(self, reader: OutboxReader, store: MarkStore, outbox_id: str, worker_id: str,
                 journal: Journal | None = None, clock: Callable[[], float] = time.monotonic, *,
                 followup_wait_s: float = 0.0) -> None:
        self.reader, self.store, self.outbox_id, self.worker_id = reader, store, outbox_id, worker_id
        self.journal, self.clock = journal, clock
        # A follow-up inserted again with the id it had waits this long before it may be claimed:
        # its own outcome, kept by another host that re-applies later, lands meanwhile (--rescue-grace).
        self.followup_wait_s = followup_wait_s
        # While re-applying: the ids the follow-ups of each parent run had (shardworker.flusher.journal).
        self.followup_ids: dict[tuple[int, int], tuple[int | None, ...]] = {}
        note = reader.note
        # The batch last seen committed: the checkpoint's note may lag (it is a hint), never lead.
        self.committed = int(note.get("batch", 0)) if note.get("outbox") == outbox_id else 0  # type: ignore[call-overload]
        self.until: dict[int, Position] | None = None  # re-applying until the reader passes these
        self.holder = f"reapply:{outbox_id}"
        self._renew_at = 0.0
        self._flushed_at_renew: dict[int, Position] = {}  # where the reader was when the hold was last moved on
        self._stuck = False  # the hold was let lapse: no progress since
        self.regressions = 0  # times the database was found gone back
        self.lost = False  # the last one went back past the kept tail: some outcomes cannot land again

    @property
    def reapplying(self) -> bool:
        return self.until is not None

    def note(self) -> dict[str, object]:
        """What the checkpoint keeps of the mark."""
        return {"outbox": self.outbox_id, "batch": self.committed}

    def mark_for(self, records: Sequence[Record]) -> Mark:
        """The mark after ``records`` (the batch about to be applied), checked against what was
        committed: every shard's position the reader has passed, and the batch's own after it."""
        positions = {shard: (p.segno, p.offset, p.seq) for shard, p in self.reader.flushed_positions().items()}
        for record in records:  # in poll order within each shard: the last one of each wins
            positions[record.shard] = (record.segno, record.end, record.seq + 1)
        return Mark(self.outbox_id, self.worker_id, self.committed + 1, positions, self.committed)

    def applied(self, mark: Mark) -> None:
        self.committed = max(self.committed, mark.batch)

    def reapplied(self, outcomes: list[Outcome], *, always: bool = False) -> list[Outcome]:
        """While re-applying (or ``always``: outcomes set aside since): those with follow-ups, to
        insert them again (``Outcome.reapplied``), with the ids they had when the journal has them."""
        if not (always or self.reapplying):
            return outcomes
        if always and not self.followup_ids and self.journal is not None:
            self.followup_ids = self.journal.load()
        return [replace(o, reapplied=True, followup_ids=self.followup_ids.get((o.job_id, o.attempt)),
                        followup_wait_s=self.followup_wait_s) if o.followups_json else o for o in outcomes]

    def others_check(self) -> bool:
        """Whether some other worker holds claims now: it re-applies what the database lost, or
        it checks whether it must (it may insert again jobs this outbox's outcomes find missing)."""
        return any(h[0] != self.holder for h in self.store.claim_holds())

    def check(self) -> None:
        """Whether the database still holds what was committed (``DatabaseWentBack`` if not);
        a database ahead of the note (a checkpoint that lagged) is taken at its word."""
        self.committed = max(self.committed, self.store.check_mark(self.outbox_id, self.committed))

    def went_back(self, *, by_hand: bool = False, from_start: bool = False) -> None:
        """The database holds less than was committed: hold claims, rewind the reader to what
        it holds (dropping the records in hand, which come again), re-apply from there.
        ``by_hand``: ``outbox reapply`` asked, whatever the marks say; ``from_start``: every
        record the outbox keeps, not only those past the database's mark."""
        found = self.store.read_mark(self.outbox_id)
        held_batch, held = (found[0], found[1]) if found is not None and not from_start else (0, {})
        self.store.hold_claims(self.holder, f"worker {self.worker_id} re-applies what the database lost", HOLD_S)
        self._renew_at = self.clock() + HOLD_RENEW_S
        self._flushed_at_renew, self._stuck = {}, False
        reached = self.reader.flushed_positions()
        if self.until is not None:  # went back again while re-applying: finish where the first one ended
            reached = {shard: max(pos, self.until.get(shard, pos)) for shard, pos in reached.items()}
        shards = set(reached) | set(self.reader.shards_on_disk())
        targets = {shard: Position(*held[shard]) if shard in held else None for shard in shards}
        whole = self.reader.rewind(targets)
        self.until, self.regressions, self.lost = reached, self.regressions + 1, not all(whole.values())
        if self.journal is not None:
            self.journal.sync()
            self.followup_ids = self.journal.load()
        if by_hand:
            log.info("re-applying the outcomes this outbox keeps past batch %d, which the database holds (it saw "
                     "batch %d committed), with every worker's claims held meanwhile", held_batch, self.committed)
        else:
            log.warning("the database went back in time: it holds batch %d of what this outbox applied, which saw "
                        "batch %d committed (a failover to a replica that lagged, or a restore); re-applying the "
                        "outcomes kept since, with every worker's claims held meanwhile", held_batch, self.committed)
        if self.lost and not from_start:
            log.warning("the database went back to before the oldest applied outcome the outbox keeps "
                        "(--reapply-window; shards %s): outcomes applied before it, if any, cannot land again, and "
                        "their jobs may run again", ", ".join(str(s) for s, ok in sorted(whole.items()) if not ok))
        self.committed = held_batch

    def progress(self) -> None:
        """While re-applying: keep the hold on claims, and end it once the reader is past where it was."""
        if self.until is None:
            return
        flushed = self.reader.flushed_positions()
        if all(flushed.get(shard, pos) >= pos for shard, pos in self.until.items()):
            self.store.hold_claims(self.holder, f"worker {self.worker_id} re-applied what the database lost",
                                   REAPPLIED_GRACE_S)
            self.until, self.followup_ids = None, {}
            log.info("re-applied what the database lost; claims resume")
        elif self.clock() >= self._renew_at:
            self._renew_at = self.clock() + HOLD_RENEW_S
            if flushed == self._flushed_at_renew:
                if not self._stuck:
                    self._stuck = True
                    log.error("re-applying what the database lost makes no progress (the flusher's log says why): "
                              "the hold on every worker's claims lapses in %.0fs; it goes on re-applying", HOLD_S)
                return  # a re-apply that is stuck does not stop every worker's claims for good
            self._flushed_at_renew, self._stuck = flushed, False
            self.store.hold_claims(self.holder, f"worker {self.worker_id} re-applies what the database lost", HOLD_S)
