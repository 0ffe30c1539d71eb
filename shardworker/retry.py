"""Retry policy: which errors are worth retrying, and how long to wait.

Connection-level failures retry slowly with capped, jittered exponential backoff;
serialization failures and deadlocks retry fast; anything else is not retried here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from shardworker.errors import DatabaseUnavailable


def is_retryable(exc: BaseException) -> bool:
    """Whether a failed database operation may succeed if simply tried again."""
    return isinstance(exc, DatabaseUnavailable) or getattr(exc, "transient", False)


@dataclass
class Backoff:
    """Capped exponential backoff with full jitter.

    The defaults, 0.05 s doubling to a 5 s cap, reach the cap after 7 failures (~3 s of
    waiting), then retry every 2.5-5 s: an outage is noticed within 5 s of its end.
    """

    base_s: float = 0.05
    cap_s: float = 5.0
    failures: int = 0
    rng: random.Random | None = None

    def next_delay(self) -> float:
        """Seconds to wait after one more failure."""
        self.failures += 1
        ceiling = min(self.cap_s, self.base_s * (2 ** min(self.failures - 1, 30)))
        return ceiling / 2 + (self.rng or random).random() * ceiling / 2

    def reset(self) -> None:
        self.failures = 0


def job_retry_delay(attempt: int, *, base_s: float = 1.0, cap_s: float = 3600.0,
                    rng: random.Random | None = None) -> float:
    """Default seconds before retrying a failed job: base * 2^(attempt-1), capped, +-25% jitter.

    1 s, 2 s, 4 s, ... an hour at attempt 13; jitter spreads retries of jobs that failed together.
    """
    delay = min(cap_s, base_s * (2 ** min(max(attempt - 1, 0), 40)))
    return delay * (0.75 + (rng or random).random() * 0.5)

