"""Outbox append throughput against a raw os.write + os.fdatasync baseline, in one run.

    python3 bench/outbox_append.py [--dir DIR] [--seconds 2.0]

Each run appends 200-byte outcomes (orjson-encoded dicts) and prints records/s: the
outbox with one fdatasync per record (a group of 1) and with group commits of 10 and 100,
and the raw baseline writing 200 B and syncing per record, or one write of 100 records per
fdatasync. Every file is appended to, as segments are, on the file system of ``--dir``
(default: a temporary directory under the current one, removed after).

fdatasync latency on a shared VM disk drifts by 2x within seconds and stalls now and then,
so the runs are interleaved in ``--rounds`` short rounds, a run's rate is taken at its
median commit time, and each ratio is the median of per-round ratios between runs made
back to back. Wall-clock rates are printed too. The target is
outbox(group 100) / raw(100) >= 0.5.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from outbox import ShardWriter  # after the path tweak, so the bench runs from a checkout

RECORD_BYTES = 200
TARGET_RATIO = 0.5


@dataclass(frozen=True)
class Result:
    """One timed run: records committed, wall time, and the median time of one commit."""

    name: str
    records: int
    seconds: float
    batch: int
    median_commit_s: float

    @property
    def rate(self) -> float:
        """Records per second at the median commit time: robust to bursts of disk contention."""
        return self.batch / self.median_commit_s

    @property
    def wall_rate(self) -> float:
        return self.records / self.seconds


def outcome(i: int) -> dict[str, object]:
    """A dict whose orjson encoding is exactly RECORD_BYTES long."""
    base = {"job": i, "attempt": 1, "status": "done", "result": ""}
    pad = RECORD_BYTES - len(orjson.dumps(base))
    return {**base, "result": "r" * pad}


def timed(name: str, seconds: float, batch: int, commit: Callable[[int], None]) -> Result:
    """Call ``commit(first_index)`` for batches of ``batch`` records until ``seconds`` pass."""
    done, start, times = 0, time.perf_counter(), []
    while (elapsed := time.perf_counter() - start) < seconds:
        t0 = time.perf_counter()
        commit(done)
        times.append(time.perf_counter() - t0)
        done += batch
    return Result(name, done, elapsed, batch, statistics.median(times))


def run_outbox(directory: str, batch: int, seconds: float) -> Result:
    """Appends through a ShardWriter, ``batch`` appends per commit (one write, one fdatasync)."""
    with ShardWriter.open(directory, shard=0) as writer:

        def commit(first: int) -> None:
            for i in range(first, first + batch):
                writer.append(outcome(i))
            writer.commit()

        label = "outbox, fdatasync per record" if batch == 1 else f"outbox, group commit of {batch}"
        return timed(label, seconds, batch, commit)


def run_raw(directory: str, batch: int, seconds: float) -> Result:
    """The floor: one os.write of ``batch`` encoded records, then one os.fdatasync."""
    fd = os.open(os.path.join(directory, "raw.bin"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:

        def commit(first: int) -> None:
            data = b"".join(orjson.dumps(outcome(i)) for i in range(first, first + batch))
            if os.write(fd, data) != len(data):
                raise OSError("short write")
            os.fdatasync(fd)

        label = "raw, fdatasync per record" if batch == 1 else f"raw, {batch} records per fdatasync"
        return timed(label, seconds, batch, commit)
    finally:
        os.close(fd)


# Each outbox run comes right after the raw run it is compared with.
RUNS: list[tuple[Callable[[str, int, float], Result], int]] = [
    (run_raw, 1), (run_outbox, 1), (run_outbox, 10), (run_raw, 100), (run_outbox, 100)]
RATIOS = [("outbox, fdatasync per record", "raw, fdatasync per record"),
          ("outbox, group commit of 100", "raw, 100 records per fdatasync")]


def one_round(root: str, round_: int, seconds: float) -> list[Result]:
    """Every run once, each in a fresh directory under ``root``."""
    results = []
    for run, batch in RUNS:
        path = os.path.join(root, f"{run.__name__}-{batch}-{round_}")
        os.mkdir(path, 0o700)
        results.append(run(path, batch, seconds))
        shutil.rmtree(path)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", help="directory to benchmark in (default: a temp dir under the current one)")
    parser.add_argument("--seconds", type=float, default=0.5, help="seconds per run and round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; rates are medians")
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="outbox-bench-", dir=args.dir or os.getcwd())
    try:
        rounds = [one_round(root, i, args.seconds) for i in range(args.rounds)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report(rounds, root)
    return 0


def report(rounds: list[list[Result]], root: str) -> None:
    print(f"{RECORD_BYTES}-byte outcomes in {os.path.dirname(root)}, {len(rounds)} rounds. records/s: "
          "at the median commit time, median over rounds (min, max); wall: all records / all time")
    print(f"{'run':<34} {'records':>9} {'seconds':>8} {'records/s':>11} {'min':>9} {'max':>9} {'wall':>9}")
    for runs in zip(*rounds, strict=True):
        rates = [r.rate for r in runs]
        records, seconds = sum(r.records for r in runs), sum(r.seconds for r in runs)
        print(f"{runs[0].name:<34} {records:>9} {seconds:>8.2f} {statistics.median(rates):>11.0f}"
              f" {min(rates):>9.0f} {max(rates):>9.0f} {records / seconds:>9.0f}")
    for ours, raw in RATIOS:
        per_round = [_rate(results, ours) / _rate(results, raw) for results in rounds]
        ratio = statistics.median(per_round)
        print(f"ratio {ours} / {raw}: {ratio:.2f} (rounds: {', '.join(f'{r:.2f}' for r in per_round)})")
    verdict = "meets" if ratio >= TARGET_RATIO else "MISSES"
    print(f"outbox(group 100) / raw(100) = {ratio:.2f}: {verdict} the target of {TARGET_RATIO}")


def _rate(results: list[Result], name: str) -> float:
    return next(r.rate for r in results if r.name == name)


if __name__ == "__main__":
    sys.exit(main())
