"""Exceptions a handler raises to say what happens to its job next.

::

    @app.handler("charge")
    def charge(job: Job) -> dict:
        if not job.payload.get("card"):
            raise Fail("no card on file")            # failed now, no more attempts
        if gateway.rate_limited():
            raise Snooze(delay_s=30)                  # back in 30 s; no attempt used
        if gateway.busy():
            raise Retry(delay_s=5)                    # a failed attempt, retried in 5 s
        if order_was_withdrawn(job.payload):
            raise Cancel("order withdrawn")           # cancelled; it will not run again
        return gateway.charge(job.payload)

``Retry`` counts as an attempt: once the job's attempts are spent it fails like any other
exception. ``Snooze`` adds one to the job's ``snoozes`` as it puts the job back, so
``job.attempt`` still counts every run while ``job.attempt - job.snoozes`` of its
``max_attempts`` are used. They
are ``Exception``s, so a handler that catches ``Exception`` around them swallows them.
"""

from __future__ import annotations

import math

from shardworker.core.limits import MAX_DELAY_S  # a century: far past any sane delay
from shardworker.errors import ConfigError


def _delay(name: str, delay_s: float) -> float:
    try:
        value = float(delay_s)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}(delay_s=…) takes seconds, not {delay_s!r}") from None
    if math.isnan(value) or value < 0:
        raise ConfigError(f"{name}(delay_s=…) must be >= 0 seconds, not {delay_s!r}")
    return min(value, MAX_DELAY_S)


class JobControl(Exception):
    """Base of the exceptions that steer a job instead of failing it the usual way."""


class Retry(JobControl):
    """Fail this attempt and run the job again after ``delay_s`` seconds (the handler's
    ``retry_delay`` is not consulted). It uses an attempt; with none left, the job fails."""

    def __init__(self, reason: str = "", *, delay_s: float = 0.0) -> None:
        self.delay_s = _delay("Retry", delay_s)
        self.reason = str(reason)
        super().__init__(self.reason or f"retry requested in {self.delay_s:g}s")


class Snooze(JobControl):
    """Put the job back to run after ``delay_s`` seconds without using up an attempt."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = _delay("Snooze", delay_s)
        super().__init__(f"snoozed for {self.delay_s:g}s")


class Fail(JobControl):
    """Fail the job now, whatever attempts remain; ``reason`` becomes its ``last_error``."""

    def __init__(self, reason: str = "failed by the handler") -> None:
        self.reason = str(reason)
        super().__init__(self.reason)


class Cancel(JobControl):
    """Mark the job ``cancelled``; it will not run again. ``reason`` becomes its ``last_error``."""

    def __init__(self, reason: str = "cancelled by the handler") -> None:
        self.reason = str(reason)
        super().__init__(self.reason)
