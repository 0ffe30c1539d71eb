"""Retry policy, in one place: which errors are worth retrying, how long to wait, and the
one loop that retries a call.

* ``is_retryable``: a lost or refused connection (``DatabaseUnavailable``) and a transient
  conflict (``TransientConflict``: serialization failure, deadlock, cancelled statement);
  anything else is a real answer and is raised at once.
* ``Backoff``: capped exponential backoff with jitter; a conflict waits on the fast
  policy, a lost connection on the slow one.
* ``retry_call``: call until it succeeds, a non-retryable error, a stop request or a
  deadline; logs the first failure and every tenth, not every retry.
* ``job_retry_delay``: the default wait before a failed *job* runs again.

Every loop in the worker (startup, the dispatcher, the flusher, shutdown, drain) uses these.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
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


def retry_call(fn: Callable[[], T], what: str, *, backoff: Backoff, log: logging.Logger,
               should_stop: Callable[[], bool] = lambda: False, deadline: float | None = None,
               retry_on: Callable[[BaseException], bool] = is_retryable,
               sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> T:
    """``fn()``, retried while it raises what ``retry_on`` accepts.

    Gives up (re-raising the last error) on a stop request, or when the next wait would
    pass ``deadline`` (monotonic). Logs the first failure and every tenth.
    """
    while True:
        try:
            result = fn()
        except Exception as exc:
            if not retry_on(exc) or should_stop():
                raise
            delay = backoff.next_delay(exc)
            if deadline is not None and clock() + delay > deadline:
                raise
            if backoff.failures == 1 or backoff.failures % 10 == 0:
                log.warning("%s failed (%s); retrying (attempt %d, next in %.2fs)", what, exc,
                            backoff.failures, delay)
            sleep(delay)
            continue
        if backoff.failures >= 1:
            log.info("%s succeeded after %d failed attempts", what, backoff.failures)
        backoff.reset()
        return result


def job_retry_delay(attempt: int, *, base_s: float = 1.0, cap_s: float = 3600.0,
                    rng: random.Random | None = None) -> float:
    """Default seconds before retrying a failed job: base * 2^(attempt-1), capped, +-25% jitter.

    1 s, 2 s, 4 s, ... an hour at attempt 13; jitter spreads retries of jobs that failed together.
    """
    delay = min(cap_s, base_s * (2 ** min(max(attempt - 1, 0), 40)))
    return delay * (0.75 + (rng or random).random() * 0.5)
