"""The throughput chart's geometry: one stacked bar (done, failed) per minute, drawn by the
template as inline SVG, so the page needs no script or library to show it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC

from shardworker.dashboard.data import Minute

WIDTH, HEIGHT = 600, 120  # SVG user units; 60 minutes of 10 units each fill the width
GAP = 2


@dataclass(frozen=True)
class Bar:
    x: float
    width: float
    done_y: float
    done_h: float
    failed_y: float
    failed_h: float
    label: str


@dataclass(frozen=True)
class Chart:
    bars: list[Bar]
    peak: int
    done: int
    failed: int


def chart(minutes: Sequence[Minute]) -> Chart:
    """Bars scaled to the busiest minute (at least 1, so an idle hour draws flat)."""
    peak = max((m.done + m.failed for m in minutes), default=0)
    scale = HEIGHT / max(peak, 1)
    step = WIDTH / max(len(minutes), 1)
    bars = []
    for i, m in enumerate(minutes):
        done_h, failed_h = m.done * scale, m.failed * scale
        bars.append(Bar(x=i * step, width=step - GAP, done_y=HEIGHT - done_h, done_h=done_h,
                        failed_y=HEIGHT - done_h - failed_h, failed_h=failed_h,
                        label=f"{m.start.astimezone(UTC):%H:%M} UTC: {m.done} done, {m.failed} failed"))
    return Chart(bars, peak, sum(m.done for m in minutes), sum(m.failed for m in minutes))
