"""Long commands show progress on a terminal and stay quiet when stderr is not one: run
through the console script with stderr on a pseudo-terminal, then on a pipe."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

from tests.helpers import enqueue, execute


def run_on(dsn: str, *args: str, tty: bool) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``shardworker ARGS --dsn DSN``; stderr a pty if ``tty``."""
    cmd = [sys.executable, "-m", "shardworker", *args, "--dsn", dsn]
    if not tty:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        return done.returncode, done.stdout, done.stderr
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, text=True)
        os.close(slave)
        stdout, _ = proc.communicate(timeout=60)
        chunks = []
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO once the pty's other end is closed and read to the end
                break
            if not chunk:
                break
            chunks.append(chunk)
        return proc.returncode, stdout, b"".join(chunks).decode(errors="replace")
    finally:
        os.close(master)


def finished_jobs(dsn: str, count: int, status: str) -> None:
    enqueue(dsn, "k", count)
    execute(dsn, "UPDATE shardworker.jobs SET status = %s, finished_at = now() - interval '1 day', attempt = 1",
            status)


def test_prune_shows_its_count_on_a_terminal_only(pg_dsn: str) -> None:
    finished_jobs(pg_dsn, 30, "done")
    code, out, err = run_on(pg_dsn, "prune", "--older-than", "1h", "--batch", "10", tty=True)
    assert (code, out) == (0, "pruned 30 jobs\n")
    assert "\rpruned 10 jobs…" in err and "\rpruned 30 jobs…" in err
    finished_jobs(pg_dsn, 30, "done")
    code, out, err = run_on(pg_dsn, "prune", "--older-than", "1h", "--batch", "10", tty=False)
    assert (code, out, err) == (0, "pruned 30 jobs\n", "")


def test_retry_failed_says_what_it_does_on_a_terminal_only(pg_dsn: str) -> None:
    finished_jobs(pg_dsn, 5, "failed")
    code, out, err = run_on(pg_dsn, "jobs", "retry", "--failed", tty=True)
    assert (code, out) == (0, "5 jobs queued again\n")
    assert "queueing failed jobs again…" in err
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'failed'")
    code, out, err = run_on(pg_dsn, "jobs", "retry", "--failed", tty=False)
    assert (code, out, err) == (0, "5 jobs queued again\n", "")


def test_drain_draws_no_bar_into_a_pipe(pg_dsn: str, tmp_path: Path) -> None:
    outbox_dir = tmp_path / "outbox"
    outbox_dir.mkdir(mode=0o700)
    code, out, err = run_on(pg_dsn, "outbox", "drain", "--outbox-dir", str(outbox_dir), tty=False)
    assert code == 0, err
    assert out.startswith("drained 0 outcomes") and "draining" not in err
    code, out, err = run_on(pg_dsn, "outbox", "drain", "--outbox-dir", str(outbox_dir), tty=True)
    assert code == 0 and "draining" in err
