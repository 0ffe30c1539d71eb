"""The outbox and a full disk, on a small real file system (a tmpfs mounted for the test, as root):
the outbox never fills its own volume (applied segments are reclaimed whatever their size), and a
volume filled by someone else stops claiming, loses nothing and resumes when space returns."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardworker.embedded import EmbeddedPostgres
from tests.helpers import (
    enqueue,
    exit_code,
    mounted_tmpfs,
    runs_per_job,
    start_worker,
    status_counts,
    wait_for,
    worker_log,
)

FAST = ("--backoff-cap", "1", "--network-timeout", "3", "--prefetch", "500")  # work in hand at a fault
RESULT_BYTES = 8 * 1024  # the counting app echoes its payload: each outcome is ~8 KiB


@pytest.fixture
def small_volume(tmp_path: Path) -> Iterator[Path]:
    """An 80 MiB tmpfs, unmounted after the test; skipped when mounting is not allowed."""
    with mounted_tmpfs(tmp_path / "volume", "80m") as mount:
        yield mount


def _done(dsn: str) -> int:
    return status_counts(dsn).get("done", 0)


def _segment_bytes(outbox_dir: Path, shard: int | None = None) -> int:
    pattern = "*.seg" if shard is None else f"shard-{shard:04d}-*.seg"
    total = 0
    for path in outbox_dir.glob(pattern):
        with contextlib.suppress(FileNotFoundError):  # deleted by the flusher meanwhile
            total += path.stat().st_size
    return total


def _wait_all_done(dsn: str, total: int, counts: Path, outbox_dir: Path, stall_s: float = 45.0) -> int:
    """Poll until ``total`` jobs are done; fail as soon as none finished for ``stall_s``.
    Returns the most segment bytes seen in ``outbox_dir`` meanwhile."""
    last, since, peak = -1, time.monotonic(), 0
    while (done := _done(dsn)) < total:
        peak = max(peak, _segment_bytes(outbox_dir))
        if done != last:
            last, since = done, time.monotonic()
        elif time.monotonic() - since > stall_s:
            pytest.fail(f"stalled at {done} of {total} done; the worker log ends:\n{worker_log(counts)[-2000:]}")
        time.sleep(0.5)
    return peak


def test_worker_with_defaults_on_an_80_mib_volume_reclaims_applied_segments(
        private_pg: EmbeddedPostgres, small_volume: Path, tmp_path: Path) -> None:
    """3,000 outcomes of ~8 KiB (24 MiB, more than the 16 MiB an 80 MiB volume leaves above the
    64 MiB --min-free-mb watermark) all apply with every default (the kept tail of applied
    outcomes gives way to the watermark), each job run once, and a restart on the same volume
    claims and applies again."""
    dsn, counts = private_pg.dsn, tmp_path / "counts"
    counts.mkdir()
    outbox_dir = small_volume / "outbox"
    enqueue(dsn, "count", 3000, {"pad": "x" * RESULT_BYTES})
    proc = start_worker(dsn, outbox_dir, counts)
    try:
        peak = _wait_all_done(dsn, 3000, counts, outbox_dir)
    finally:
        proc.send_signal(signal.SIGTERM)
    assert exit_code(proc, 60, counts) == 0, worker_log(counts)[-3000:]
    assert set(runs_per_job(counts).values()) == {1}, "a job ran twice"
    # Claiming may pause briefly while the flusher lags (that backlog is not applied yet); it
    # must resume, which the stall check above asserts.
    print(f"peak segment bytes: {peak}")

    # Fewer children than last run: shard 1 has no writer now, and its applied segments go too
    # (kept for no time: the kept tail gave way above to the disk's watermark; here, none).
    enqueue(dsn, "count", 300, {"pad": "y" * RESULT_BYTES})
    again = start_worker(dsn, outbox_dir, counts, "--exit-when-idle", "--reapply-window", "0", procs=1)
    assert exit_code(again, 180, counts) == 0, worker_log(counts)[-3000:]
    assert status_counts(dsn) == {"done": 3300}
    assert set(runs_per_job(counts).values()) == {1}, "a job ran twice"
    assert _segment_bytes(outbox_dir, shard=1) <= 50, "the gone child's applied segments are kept"
    held = _segment_bytes(outbox_dir)
    assert held < 4 * 1024 * 1024, f"{held} bytes of applied segments still held"


def _mount_tmpfs(path: Path, size_mb: int) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount tmpfs here: {done.stderr.strip()}")


def _fill(path: Path, leave_bytes: int) -> None:
    """Fill ``path``'s file system until at most ``leave_bytes`` are free."""
    st = os.statvfs(path.parent)
    free = st.f_bavail * st.f_frsize
    try:
        with open(path, "wb") as f:  # the outbox may have filled it already: ENOSPC at the open
            f.write(b"\1" * max(0, free - leave_bytes))
            f.flush()
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise  # full: exactly what we wanted; anything else is not


def test_outbox_disk_full_stops_claiming_loses_nothing_and_resumes(
        private_pg: EmbeddedPostgres, tmp_path: Path) -> None:
    """Outbox on a small tmpfs filled up: the worker stops claiming and says why, children hold their outcomes
    through ENOSPC, and everything lands once space returns."""
    mount = tmp_path / "disk"
    _mount_tmpfs(mount, 32)
    try:
        dsn, counts = private_pg.dsn, tmp_path / "counts"
        counts.mkdir()
        outbox_dir = mount / "outbox"
        enqueue(dsn, "slow", 300, {"sleep": 0.01})
        proc = start_worker(dsn, outbox_dir, counts, *FAST, "--min-free-mb", "8", procs=2)
        wait_for(lambda: status_counts(dsn).get("done", 0) >= 20, 30, "a first part done")
        filler = mount / "filler"
        _fill(filler, leave_bytes=0)  # children hold jobs; their next commit finds no room
        time.sleep(2)
        done_while_full = status_counts(dsn).get("done", 0)
        time.sleep(1)
        assert status_counts(dsn).get("done", 0) == done_while_full, "outcomes applied without a durable record"
        assert done_while_full < 300
        log = worker_log(counts)
        assert "not claiming: the outbox disk is nearly full" in log, log
        assert "until space returns" in log, log
        assert proc.poll() is None, log
        filler.unlink(missing_ok=True)
        wait_for(lambda: status_counts(dsn) == {"done": 300}, 60, "everything done once space returned")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, worker_log(counts)
        assert set(runs_per_job(counts).values()) == {1}
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
