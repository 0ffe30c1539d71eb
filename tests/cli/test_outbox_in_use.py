"""An outbox directory in use: a second worker, or a drain, started on the outbox a running
worker holds is refused with one line naming the holder's pid and --outbox-dir."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers import query, start_worker, wait_for, worker_env


def _shardworker(count_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardworker", *args], env=worker_env(count_dir),
                          capture_output=True, text=True, timeout=120)


def test_a_second_worker_and_a_drain_on_a_held_outbox_name_the_holder(tmp_path: Path, pg_dsn: str) -> None:
    outbox_dir = tmp_path / "outbox"
    first = start_worker(pg_dsn, outbox_dir, tmp_path)
    wait_for(lambda: bool(query(pg_dsn, "SELECT 1 FROM shardworker.workers WHERE pid = %s", first.pid)), 60,
             "the first worker's row")
    second = _shardworker(tmp_path, "run", "--app", "counting_app", "--outbox-dir", str(outbox_dir),
                          "--dsn", pg_dsn, "--exit-when-idle")
    assert second.returncode == 1 and second.stdout == ""
    assert second.stderr == (f"error: --outbox-dir {outbox_dir} is in use by a worker (pid {first.pid}); give each "
                             "worker an --outbox-dir of its own, or stop that one first\n")
    drain = _shardworker(tmp_path, "outbox", "drain", "--outbox-dir", str(outbox_dir), "--dsn", pg_dsn)
    assert drain.returncode == 1
    assert drain.stderr == (f"error: --outbox-dir {outbox_dir} is in use by a worker (pid {first.pid}); a running "
                            "worker applies its outbox itself: drain it once that worker has stopped\n")
    first.send_signal(signal.SIGTERM)
    assert first.wait(60) == 0
    assert os.path.exists(outbox_dir / "worker.lock")
    after = _shardworker(tmp_path, "outbox", "drain", "--outbox-dir", str(outbox_dir), "--dsn", pg_dsn)
    assert after.returncode == 0, after.stderr


def test_a_folder_of_other_files_is_not_taken_for_an_outbox(tmp_path: Path, pg_dsn: str) -> None:
    """--outbox-dir naming a folder that holds files of the user's and nothing of an outbox: one
    line, exit 1, and the folder is left as it was (its mode too), for a run and a drain."""
    exports = tmp_path / "exports"
    exports.mkdir(mode=0o755)
    os.chmod(exports, 0o755)
    (exports / "invoice-1.pdf").write_text("a")
    for args in (["run", "--app", "counting_app", "--dsn", pg_dsn, "--exit-when-idle"],
                 ["outbox", "drain", "--dsn", pg_dsn]):
        result = _shardworker(tmp_path, *args, "--outbox-dir", str(exports))
        assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(f"error: --outbox-dir {exports} holds files that are not an outbox's "
                                        "(invoice-1.pdf)"), result.stderr
    assert sorted(p.name for p in exports.iterdir()) == ["invoice-1.pdf"]
    assert exports.stat().st_mode & 0o777 == 0o755
