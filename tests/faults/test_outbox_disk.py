"""The outbox never fills its own volume: applied segments are reclaimed whatever their
size, on a small real file system (a tmpfs mounted for the test, as root)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardworker.embedded import EmbeddedPostgres
from tests.helpers import enqueue, exit_code, runs_per_job, start_worker, status_counts, worker_log

RESULT_BYTES = 8 * 1024  # the counting app echoes its payload: each outcome is ~8 KiB


@pytest.fixture
def small_volume(tmp_path: Path) -> Iterator[Path]:
    """An 80 MiB tmpfs, unmounted after the test; skipped when mounting is not allowed."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "volume"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=80m,mode=0700", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _done(dsn: str) -> int:
    return status_counts(dsn).get("done", 0)


def _wait_all_done(dsn: str, total: int, counts: Path, stall_s: float = 45.0) -> None:
    """Poll until ``total`` jobs are done; fail as soon as none finished for ``stall_s``."""
    last, since = -1, time.monotonic()
    while (done := _done(dsn)) < total:
        if done != last:
            last, since = done, time.monotonic()
        elif time.monotonic() - since > stall_s:
            pytest.fail(f"stalled at {done} of {total} done; the worker log ends:\n{worker_log(counts)[-2000:]}")
        time.sleep(0.5)


def test_worker_with_defaults_on_an_80_mib_volume_reclaims_applied_segments(
        private_pg: EmbeddedPostgres, small_volume: Path, tmp_path: Path) -> None:
    """3,000 outcomes of ~8 KiB (24 MiB, more than the 16 MiB an 80 MiB volume leaves above the
    64 MiB --min-free-mb watermark) all apply with every default, each job run once, and a
    restart on the same volume claims and applies again."""
    dsn, counts = private_pg.dsn, tmp_path / "counts"
    counts.mkdir()
    outbox_dir = small_volume / "outbox"
    enqueue(dsn, "count", 3000, {"pad": "x" * RESULT_BYTES})
    proc = start_worker(dsn, outbox_dir, counts)
    try:
        _wait_all_done(dsn, 3000, counts)
    finally:
        proc.send_signal(signal.SIGTERM)
    assert exit_code(proc, 60, counts) == 0, worker_log(counts)[-3000:]
    assert set(runs_per_job(counts).values()) == {1}, "a job ran twice"

    enqueue(dsn, "count", 300, {"pad": "y" * RESULT_BYTES})
    again = start_worker(dsn, outbox_dir, counts, "--exit-when-idle")
    assert exit_code(again, 180, counts) == 0, worker_log(counts)[-3000:]
    assert status_counts(dsn) == {"done": 3300}
    assert set(runs_per_job(counts).values()) == {1}, "a job ran twice"
    held = sum(f.stat().st_size for f in outbox_dir.glob("*.seg"))
    assert held < 4 * 1024 * 1024, f"{held} bytes of applied segments still held"
