"""``job.sleep``, ``job.wait_event``, ``job.send_event`` and ``job.progress``: one run's waits,
the events it sends and how far it got.

A wait is a step (``shardworker.child.steps``) whose result the *database* records: when the
handler reaches a wait not recorded yet, the run ends there (``Suspend``, which no ``except
Exception`` catches) with a ``suspended`` outcome saying what it waits on. Applied through
the outbox like any outcome (no attempt used, as a snooze), it leaves the job ``waiting`` in its
row, holding no child, thread or connection (``shardworker.begin_wait``, migration 0025):

* a sleep records its step at once (``{"slept_until": t}``) and the job is queued again at ``t``
  (the child's clock when the handler asked, plus the seconds): its next run passes the sleep,
  whenever and wherever it comes;
* a wait for an event is ended by ``send_event`` to its key (the payload recorded as
  ``{"event": payload}``), by an event sent to that key since the job was enqueued (it is
  never lost), or by its timeout (``{"timeout": true}``: ``EventTimeout`` at that wait, in
  this run and every later one).

The next run replays every step before the wait from its records, and the wait returns at once.
A wait whose end the database recorded is appended to the outbox too, as a step record, when a
run passes it: a database that comes back older (a failover, a restore) gets it back with the
steps after it, which the outbox keeps. Once a run reaches a wait nothing more of it counts: a
step, a wait or a send in a ``finally`` that runs while the wait unwinds the handler raises
``Suspend`` again, and progress is dropped.

``job.send_event(key, payload)`` keeps the event with the run's outcome: it is sent in the
transaction that applies the outcome, when the run ends done, snoozed or suspended (not when it
fails or is cancelled: its retry sends it). Each carries its place among the job's sends
(``shardworker.job_sends``), so a run replayed after a wait sends each once; and the sends
before a wait the run passed are not carried again (the run that reached that wait sent them).

``job.progress(value)`` appends a progress record to the outbox (no fsync of its own: it rides
the next group commit), at most one per ``PROGRESS_EVERY_S`` for a job; a value reported
sooner waits for the next report or for the run's end, so the last value always lands.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from shardworker.child.steps import StepLog, Suspend
from shardworker.core import events
from shardworker.core.limits import MAX_DELAY_S, MAX_PROGRESS_BYTES
from shardworker.core.model import ProgressRecord, StepRecord, dumps_exact, has_non_finite, loads_exact
from shardworker.core.records import encode_progress, encode_step
from shardworker.errors import EventError, EventTimeout

__all__ = ["PROGRESS_EVERY_S", "Suspend", "Waits"]

PROGRESS_EVERY_S = 0.25  # at most one progress record a job this often; the last always lands
log = logging.getLogger(__name__)


class Waits:
    """One run's waits, sent events and progress. ``note`` appends a progress record to the
    outbox without waiting for it (None: progress is dropped, as in a Job made by hand)."""

    def __init__(self, log: StepLog, note: Callable[[bytes], None] | None = None, *, is_async: bool = False,
                 clock: Callable[[], float] = time.time) -> None:
        self.log, self.note, self.is_async, self.clock = log, note, is_async, clock
        self.wait: dict[str, Any] | None = None  # what the run waits on, once it reached a wait
        self.sent: list[list[Any]] = []  # [key, payload, place] of each job.send_event since the last wait passed
        self.sends = 0  # the run's job.send_event calls so far: the next one's place
        self._progress_at = -math.inf
        self._progress_held: bytes | None = None
        self._warned = False  # a progress value was dropped (said once a run)

    # --- sleep and wait_event -------------------------------------------------------------

    def sleep(self, name: str, seconds: Any) -> Any:
        seconds = _seconds("job.sleep", seconds)
        found, value = self.log.begin(name)
        if not found:
            self._suspend({"kind": "sleep", "name": name, "until": self.clock() + seconds})
        self._passed(name, value)
        return self._returning(None)

    def wait_event(self, name: str, key: str, timeout_s: Any = None) -> Any:
        key = events.check_key(key)
        timeout = None if timeout_s is None else _seconds("job.wait_event(timeout_s=…)", timeout_s)
        found, value = self.log.begin(name)
        if not found:
            until = None if timeout is None else self.clock() + timeout
            self._suspend({"kind": "event", "name": name, "key": key, "until": until})
        self._passed(name, value)
        if isinstance(value, dict) and "event" in value:
            return self._returning(value["event"])
        if isinstance(value, dict) and value.get("timeout"):
            return self._raising(EventTimeout(f"job {self.log.job.id}: no event {key!r} came before the timeout of "
                                              f"its wait {name!r}"))
        return self._raising(EventError(f"job {self.log.job.id}: the step {name!r} holds no event: a step and a "
                                        "wait share names within a job"))

    def _suspend(self, wait: dict[str, Any]) -> None:
        self.wait = wait
        self.log.suspended = True
        raise Suspend(f"job {self.log.job.id} waits: {wait['kind']} {wait['name']!r}")

    def _passed(self, name: str, value: Any) -> None:
        """A wait this run passes, its end recorded by the database (the sleep, the event, the
        timeout): appended to the outbox as a step record (kept with the steps after it, for a
        database that comes back older), and the sends before it dropped (sent already)."""
        self.sent.clear()
        if self.note is not None:
            job = self.log.job
            self.note(encode_step(StepRecord(job.id, job.attempt, name, dumps_exact(value), self.clock(), job.uid)))

    def _returning(self, value: Any) -> Any:
        if not self.is_async:
            return value

        async def passed() -> Any:
            return value
        return passed()

    def _raising(self, exc: BaseException) -> Any:
        if not self.is_async:
            raise exc

        async def failing() -> Any:
            raise exc
        return failing()

    # --- send_event ---------------------------------------------------------------------------

    def send_event(self, key: str, payload: Any = None) -> Any:
        if self.wait is not None:
            raise Suspend(f"job {self.log.job.id}: the run ended at a wait; send_event({key!r:.80}) is for its "
                          "next run")
        key = events.check_key(key)
        value = loads_exact(events.payload_json(payload).decode("utf-8"))
        self.sent.append([key, value, self.sends])
        self.sends += 1
        return self._done()

    # --- progress -----------------------------------------------------------------------------

    def progress(self, value: Any) -> Any:
        if self.wait is not None:
            return self._done()  # the run ended at a wait: what a finally reports while it unwinds is not progress
        encoded = self._progress_json(value)
        if encoded is None:
            return self._done()
        now = self.clock()
        if now - self._progress_at < PROGRESS_EVERY_S:
            self._progress_held = encoded
            return self._done()
        self._write_progress(encoded, now)
        return self._done()

    def _progress_json(self, value: Any) -> bytes | None:
        """The value as JSON, or None (and a warning, once a run) for one that cannot be shown: a
        status report never fails the job it reports on."""
        try:
            encoded = dumps_exact(value)
        except (TypeError, ValueError) as exc:
            return self._unshown(f"not JSON ({exc})")
        if len(encoded) > MAX_PROGRESS_BYTES:
            return self._unshown(f"{len(encoded)} bytes of JSON, over the {MAX_PROGRESS_BYTES} a value may hold "
                                 "(shardworker.core.limits.MAX_PROGRESS_BYTES)")
        if (b"null" in encoded and has_non_finite(value)) or b"\\u0000" in encoded:
            return self._unshown("it holds nan, infinity or a NUL, which JSON in PostgreSQL cannot")
        return encoded

    def _unshown(self, why: str) -> bytes | None:
        """No value to show (None), said once a run."""
        if not self._warned:
            self._warned = True
            log.warning("job %d: job.progress value dropped: %s", self.log.job.id, why)
        return None

    def _done(self) -> Any:
        """What ``send_event`` and ``progress`` return: nothing to wait for; in an ``async def``
        handler a finished future, so ``await job.progress(...)`` works too."""
        if not self.is_async:
            return None
        future = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future

    def flush(self) -> None:
        """At the run's end: the progress reported since the last record, written now."""
        if self._progress_held is not None:
            self._write_progress(self._progress_held, self.clock())

    def _write_progress(self, encoded: bytes, now: float) -> None:
        self._progress_at, self._progress_held = now, None
        if self.note is not None:
            job = self.log.job
            self.note(encode_progress(ProgressRecord(job.id, job.attempt, encoded, now, job.uid)))

    # --- what lands with the outcome ---------------------------------------------------------

    def extras(self, *, sends: bool) -> bytes | None:
        """The outcome's extras (``Outcome.extras_json``): the wait, and the events sent when
        ``sends`` (the run ended done, snoozed or suspended); None when there are neither."""
        extras: dict[str, Any] = {}
        if self.wait is not None:
            extras["wait"] = self.wait
        if sends and self.sent:
            extras["events"] = self.sent
        return dumps_exact(extras) if extras else None


def _seconds(what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) or value < 0:
        raise ValueError(f"{what} takes seconds >= 0, not {value!r:.80}")
    return float(min(value, MAX_DELAY_S))
