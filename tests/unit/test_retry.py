"""Unit tests of the retry policy in ``shardworker.core.retry``: ``Backoff`` for database loops,
``job_retry_delay`` for failed jobs, and which errors ``is_retryable``."""

from __future__ import annotations

import random

import pytest

from shardworker.core.retry import Backoff, is_retryable, job_retry_delay
from shardworker.errors import DatabaseUnavailable, StoreError, TransientConflict


def test_backoff_first_delay_is_jittered_within_half_to_full_base() -> None:
    """The first delay lies in [base/2, base]."""
    for seed in range(50):
        delay = Backoff(base_s=0.2, cap_s=5.0, rng=random.Random(seed)).next_delay()
        assert 0.1 <= delay <= 0.2


def test_backoff_doubles_until_the_cap_then_stays_within_half_cap_to_cap() -> None:
    """The ceiling doubles per failure up to the cap; every delay lies in [ceiling/2, ceiling]."""
    backoff = Backoff(base_s=0.05, cap_s=1.0, rng=random.Random(7))
    delays = [backoff.next_delay() for _ in range(60)]
    for failure, delay in enumerate(delays, 1):
        ceiling = min(1.0, 0.05 * 2 ** (failure - 1))
        assert ceiling / 2 <= delay <= ceiling, (failure, delay)
    assert max(delays) <= 1.0
    assert backoff.failures == 60


def test_backoff_is_capped_after_very_many_failures() -> None:
    """Thousands of failures never overflow or exceed the cap."""
    backoff = Backoff(base_s=0.05, cap_s=5.0, rng=random.Random(3))
    delays = [backoff.next_delay() for _ in range(5000)]
    assert all(2.5 <= d <= 5.0 for d in delays[20:])


def test_backoff_jitter_varies_delays_at_the_cap() -> None:
    """Delays at the cap are spread out, not one fixed value."""
    backoff = Backoff(base_s=1.0, cap_s=1.0, rng=random.Random(11))
    delays = [backoff.next_delay() for _ in range(200)]
    assert len({round(d, 6) for d in delays}) > 150
    assert min(delays) < 0.6 and max(delays) > 0.9  # covers most of [0.5, 1.0]


def test_backoff_reset_starts_again_from_the_base() -> None:
    """After reset the failure count is zero and the next delay is back in [base/2, base]."""
    backoff = Backoff(base_s=0.1, cap_s=10.0, rng=random.Random(5))
    for _ in range(10):
        backoff.next_delay()
    backoff.reset()
    assert backoff.failures == 0
    assert 0.05 <= backoff.next_delay() <= 0.1
    assert backoff.failures == 1


@pytest.mark.parametrize(("attempt", "nominal"), [(1, 1.0), (2, 2.0), (3, 4.0), (10, 512.0), (13, 3600.0),
                                                  (50, 3600.0), (0, 1.0), (-3, 1.0)])
def test_job_retry_delay_doubles_per_attempt_with_25_percent_jitter(attempt: int, nominal: float) -> None:
    """job_retry_delay is base * 2^(attempt-1), capped at an hour, within +-25%."""
    rng = random.Random(attempt)
    delays = [job_retry_delay(attempt, rng=rng) for _ in range(100)]
    assert all(0.75 * nominal <= d <= 1.25 * nominal for d in delays), (min(delays), max(delays))
    assert max(delays) - min(delays) > 0.25 * nominal  # jitter actually spreads them


def test_job_retry_delay_honours_base_and_cap() -> None:
    """A custom base and cap scale and bound the delay."""
    assert 7.5 <= job_retry_delay(1, base_s=10.0, cap_s=100.0) <= 12.5
    assert 75.0 <= job_retry_delay(30, base_s=10.0, cap_s=100.0) <= 125.0


def test_is_retryable_accepts_outages_and_transient_conflicts_only() -> None:
    """DatabaseUnavailable and transient StoreErrors retry; other errors do not."""
    transient = TransientConflict("deadlock")
    assert is_retryable(DatabaseUnavailable())
    assert is_retryable(transient)
    assert not is_retryable(StoreError("syntax error"))
    assert not is_retryable(ValueError("x"))
