"""The one test clock: time that moves only when a test (or the code's ``sleep``) moves it."""

from __future__ import annotations


class FakeClock:
    """Call it for the time (a ``time.monotonic`` stand-in); ``sleep`` moves it on and keeps
    what was slept (``slept``, ``sleeps``); a test moves it with ``now += seconds``."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    @property
    def sleeps(self) -> int:
        return len(self.slept)
