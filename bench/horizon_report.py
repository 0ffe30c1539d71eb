"""The table and the verdict of bench/horizon.py: per window, and minute 1 against the held
minute 2 and the minute after the release."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Window:
    """What one window (10 s at full scale) saw."""

    t: float  # seconds from the start of the load
    enqueued_per_s: float  # jobs enqueued in the window, per second
    done_per_s: float  # jobs finished in the window, per second
    claim_ms: list[float]  # each claim statement's duration, sorted
    e2e_p99_ms: float | None  # enqueue -> done p99 of the jobs enqueued in the window
    backlog: int  # jobs enqueued and not finished at the window's end
    dead: int  # n_dead_tup of shardworker.jobs at the window's end
    claim_idx: int  # bytes of jobs_claim_idx at the window's end
    probe_pages: int  # pages a read-only scan of the first 64 due queued jobs touched


def pct(sorted_ms: list[float], q: float) -> float | None:
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))] if sorted_ms else None


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def minute(rows: list[Window], lo: float, hi: float) -> list[Window]:
    return [w for w in rows if lo <= w.t < hi]


def claim_p99(rows: list[Window]) -> float | None:
    return pct(sorted(m for w in rows for m in w.claim_ms), 0.99)


def print_table(rows: list[Window], hold: tuple[float, float]) -> None:
    print("| t s | horizon | enqueued/s | done/s | claims | claim p50 ms | claim p99 ms | enqueue->done p99 ms "
          "| backlog | n_dead_tup | claim idx kB | probe pages |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for w in rows:
        held = "held" if hold[0] <= w.t < hold[1] else ""
        print(f"| {w.t:.0f} | {held} | {w.enqueued_per_s:,.0f} | {w.done_per_s:,.0f} | {len(w.claim_ms)} "
              f"| {fmt(pct(w.claim_ms, 0.5), '.2f')} | {fmt(pct(w.claim_ms, 0.99), '.2f')} "
              f"| {fmt(w.e2e_p99_ms, '.0f')} | {w.backlog:,} | {w.dead:,} "
              f"| {w.claim_idx // 1024:,} | {w.probe_pages:,} |")


def print_report(rows: list[Window], window: float, minute_s: float, logged: bool) -> None:
    """The table, then each target against minute 1."""
    print_table(rows, (minute_s, 2 * minute_s))
    first, held, after = (minute(rows, k * minute_s, (k + 1) * minute_s) for k in range(3))
    rate1, rate2 = (sum(w.done_per_s for w in m) / max(1, len(m)) for m in (first, held))
    enq1, enq2 = (sum(w.enqueued_per_s for w in m) / max(1, len(m)) for m in (first, held))
    print(f"enqueued/s: minute 1 {enq1:,.0f}, held minute {enq2:,.0f} (done/s follows it while the backlog "
          f"stays small: worst backlog {max(w.backlog for w in rows):,})")
    e2e1, e2e2 = (max((w.e2e_p99_ms or 0.0) for w in m) if m else None for m in (first, held))
    print(f"done/s: minute 1 {rate1:,.0f}, held minute {rate2:,.0f} ({rate2 / max(rate1, 1e-9):.2f}x; "
          f"target >= 0.90x): {'meets' if rate2 >= 0.9 * rate1 else 'misses'}")
    if e2e1 and e2e2 is not None:
        print(f"enqueue->done p99 (worst window): minute 1 {e2e1:.0f} ms, held minute {e2e2:.0f} ms "
              f"({e2e2 / e2e1:.2f}x; target <= 2x): {'meets' if e2e2 <= 2 * e2e1 else 'misses'}")
    base = claim_p99(first)
    if not logged or base is None:
        print("claim p99: not measured (no server log; see --server-log)")
        return
    # The first window of minute 3 from which every window stays within 1.5x.
    back = next((w for i, w in enumerate(after)
                 if all((p := pct(v.claim_ms, 0.99)) is not None and p <= 1.5 * base for v in after[i:])), None)
    print(f"claim p99: minute 1 {base:.2f} ms, held minute {fmt(claim_p99(held), '.2f')} ms, "
          f"last window {fmt(pct(rows[-1].claim_ms, 0.99), '.2f')} ms; back within 1.5x "
          + (f"{back.t + window - 2 * minute_s:.0f} s after the release: meets" if back
             else "not within a minute of the release: misses"))
