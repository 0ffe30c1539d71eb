"""Retry policy, in one place: which errors are worth retrying, how long to wait, and the
one loop that retries a call.

* ``is_retryable``: a lost or refused connection (``DatabaseUnavailable``) and a transient
  conflict (``TransientConflict``: serialization failure, deadlock, cancelled statement);
  anything else is a real answer and is raised at once.
* ``Backoff``: capped exponential backoff with jitter; a conflict waits on the fast
  policy, a lost connection on the slow one.
* ``Outage``: one loop's failure state (since when, why, how many failures): it raises
  what is not retryable, decides the next delay, and tells the outage once when it starts
  and once when it ends.
* ``retry_call``: call until it succeeds, a non-retryable error, a stop request or a
  deadline, keeping its failures in an ``Outage``.
* ``job_retry_delay``: the default wait before a failed *job* runs again.

Every loop in the worker (startup, the dispatcher, the flusher, the heartbeat,
housekeeping, shutdown, drain) uses these.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from shardworker.errors import DatabaseUnavailable, TransientConflict

T = TypeVar("T")


def is_retryable(exc: BaseException) -> bool:
    """Whether a failed database operation may succeed if simply tried again."""
    return isinstance(exc, DatabaseUnavailable | TransientConflict)


# The slow policy (a lost connection), by default: 0.05 s doubling to a 5 s cap, reached
# after 7 failures (~3 s of waiting), then every 2.5-5 s: the end of an outage is noticed
# within 5 s. The fast policy (a conflict, which clears as soon as the other transaction
# ends): 5 ms doubling to 0.2 s, never slower than the slow one.
SLOW_BASE_S, SLOW_CAP_S = 0.05, 5.0
FAST_BASE_S, FAST_CAP_S = 0.005, 0.2


@dataclass
class Backoff:
    """Capped exponential backoff with jitter: each delay is between half and all of its
    ceiling, ``base_s * 2**(failures - 1)`` capped at ``cap_s`` (the fast policy's numbers
    for a conflict)."""

    base_s: float = SLOW_BASE_S
    cap_s: float = SLOW_CAP_S
    failures: int = 0
    rng: random.Random | None = None

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.cap_s:
            raise ValueError(f"backoff needs 0 < base_s <= cap_s (got {self.base_s}, {self.cap_s})")

    def next_delay(self, exc: BaseException | None = None) -> float:
        """Seconds to wait after one more failure (the fast policy when ``exc`` is a conflict)."""
        self.failures += 1
        base, cap = self.base_s, self.cap_s
        if isinstance(exc, TransientConflict):
            base, cap = min(FAST_BASE_S, base), min(FAST_CAP_S, cap)
        ceiling = min(cap, base * (2 ** min(self.failures - 1, 30)))
        return ceiling / 2 + (self.rng or random).random() * ceiling / 2

    def reset(self) -> None:
        self.failures = 0


@dataclass
class Outage:
    """The failure state of one loop that talks to the database.

    ``failed(exc)`` re-raises an error that is not retryable (a real answer: retrying it
    would only repeat it); otherwise it returns the seconds to wait (the backoff's, never
    under ``floor_s``) and, on the first failure of a streak, logs ``started``.
    ``recovered()`` ends the streak, logging ``ended`` when there is one. An unreachable
    database is logged at WARNING/INFO only with ``tell_unreachable``; a worker's loops leave
    it to the parent's one watch (``shardworker.worker.dbwatch``) and log it at DEBUG. Any
    other retryable failure (a conflict, a statement timeout) starts at WARNING.

    The messages are ``str.format`` templates over ``what``, ``error``, ``delay``,
    ``seconds`` (the streak's length) and ``failures``.
    """

    what: str
    log: logging.Logger
    backoff: Backoff = field(default_factory=Backoff)
    floor_s: float = 0.0
    started: str = "{what} failed ({error}); retrying"
    ended: str | None = "{what} succeeded after {failures} failed attempts"
    tell_unreachable: bool = False
    clock: Callable[[], float] = time.monotonic
    since: float | None = None  # when the streak began (clock), None while all is well
    unreachable: str = ""  # why, while the last failure was an unreachable database

    @property
    def failures(self) -> int:
        return self.backoff.failures

    def failed(self, exc: BaseException) -> float:
        """Count one failure of ``exc``; seconds to wait before the next try."""
        if not is_retryable(exc):
            raise exc
        delay = max(self.floor_s, self.backoff.next_delay(exc))
        down = isinstance(exc, DatabaseUnavailable)
        self.unreachable = (str(exc) or type(exc).__name__) if down else ""
        if self.since is None:
            self.since = self.clock()
            level = logging.DEBUG if down and not self.tell_unreachable else logging.WARNING
            self.log.log(level, self._text(self.started, exc, delay))
        return delay

    def recovered(self) -> None:
        """The loop's call succeeded: end the streak (telling so) and reset the backoff."""
        if self.since is not None and self.ended is not None:
            self.log.log(logging.INFO if self.tell_unreachable else logging.DEBUG, self._text(self.ended))
        self.since, self.unreachable = None, ""
        self.backoff.reset()

    def _text(self, template: str, exc: BaseException | None = None, delay: float = 0.0) -> str:
        seconds = 0.0 if self.since is None else self.clock() - self.since
        return template.format(what=self.what, error=exc, delay=delay, seconds=seconds, failures=self.failures)


def retry_call(fn: Callable[[], T], what: str, *, backoff: Backoff, log: logging.Logger,
               should_stop: Callable[[], bool] = lambda: False, deadline: float | None = None,
               sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> T:
    """``fn()``, retried while it raises a retryable error.

    Gives up (re-raising the last error) on a stop request, or when the next wait would
    pass ``deadline`` (monotonic). Tells the first failure and the success after failures.
    """
    outage = Outage(what, log, backoff, started="{what} failed ({error}); retrying (next in {delay:.2f}s)",
                    tell_unreachable=True, clock=clock)
    while True:
        try:
            result = fn()
        except Exception as exc:
            if should_stop():
                raise
            delay = outage.failed(exc)
            if deadline is not None and clock() + delay > deadline:
                raise
            sleep(delay)
            continue
        outage.recovered()
        return result


def job_retry_delay(attempt: int, *, base_s: float = 1.0, cap_s: float = 3600.0,
                    rng: random.Random | None = None) -> float:
    """Default seconds before retrying a failed job: base * 2^(attempt-1), capped, +-25% jitter.

    1 s, 2 s, 4 s, ... an hour at attempt 13; jitter spreads retries of jobs that failed together.
    """
    delay = min(cap_s, base_s * (2 ** min(max(attempt - 1, 0), 40)))
    return delay * (0.75 + (rng or random).random() * 0.5)
