"""``shardworker doctor`` on a real PostgreSQL with real faults of the outbox: pending
outcomes with no worker, loose modes, a file of another user, an outbox bound to another
database, a quarantined segment, a full disk (by the watermark), a missing directory; and
once through the console script from a project directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from outbox.recovery import quarantine
from outbox.segment import list_segments
from shardworker.cli.main import main
from shardworker.core.layout import lock_outbox
from shardworker.store.migrate import apply_migrations
from shardworker.store.pg_store import PgStore
from tests.cli.doctor_report import REPO, bound_outbox, pending_outcomes, report
from tests.helpers import query

pytestmark = pytest.mark.usefixtures("in_tmp_path")


# --- outbox faults -------------------------------------------------------------------------


def test_doctor_says_to_drain_pending_outcomes_when_no_worker_runs(tmp_path: Path, pg_dsn: str,
                                                                  store: PgStore) -> None:
    """Pending outcomes and no worker: FAIL naming `outbox drain`; while a worker holds the
    directory they are its flusher's (ok); drained, nothing pending."""
    outbox_dir = bound_outbox(tmp_path / "outbox", store)
    pending_outcomes(outbox_dir, store, pg_dsn, 3)
    code, checks = report("--dsn", pg_dsn, "--outbox-dir", str(outbox_dir))
    assert code == 1
    pending = checks["pending"]
    assert pending["status"] == "fail" and pending["pending"] == 3 and pending["bytes"] > 0
    assert pending["oldest_age_s"] is not None and pending["worker_running"] is False
    assert f"shardworker outbox drain --outbox-dir {outbox_dir}" in pending["action"]
    fd = lock_outbox(str(outbox_dir), "worker")
    try:
        code, checks = report("--dsn", pg_dsn, "--outbox-dir", str(outbox_dir))
        assert (code, checks["pending"]["status"], checks["pending"]["worker_running"]) == (0, "ok", True)
    finally:
        os.close(fd)
    drained = CliRunner().invoke(main, ["outbox", "drain", "--outbox-dir", str(outbox_dir), "--dsn", pg_dsn,
                                        "--timeout", "10"])
    assert drained.exit_code == 0, drained.output
    code, checks = report("--dsn", pg_dsn, "--outbox-dir", str(outbox_dir))
    assert (code, checks["pending"]["pending"]) == (0, 0)


def test_doctor_flags_an_outbox_open_to_other_users(tmp_path: Path, pg_dsn: str, store: PgStore) -> None:
    """A 0755 directory and a 0644 segment are flagged with the chmod that fixes them; after it, ok."""
    outbox_dir = bound_outbox(tmp_path / "outbox", store)
    pending_outcomes(outbox_dir, store, pg_dsn, 1)
    [segno] = list_segments(str(outbox_dir))[0]
    segment = outbox_dir / f"shard-0000-{segno:010d}.seg"
    os.chmod(outbox_dir, 0o755)
    code, checks = report("--dsn", pg_dsn, "--outbox-dir", str(outbox_dir))
    assert code == 1 and checks["modes"]["status"] == "fail"
    assert checks["modes"]["too_open"] == [str(outbox_dir)]
    os.chmod(outbox_dir, 0o700)
    os.chmod(segment, 0o644)
    code, checks = report("--dsn", pg_dsn, "--outbox-dir", str(outbox_dir))
    assert code == 1 and checks["modes"]["too_open"] == [segment.name]
    assert f"{segment.name} (0644)" in checks["modes"]["detail"]
    fix = re.fullmatch(r"run `(.*)`", checks["modes"]["action"])
    assert fix is not None
    subprocess.run(fix[1], shell=True, check=True)  # the advice, as printed
    assert report("--dsn", pg_dsn, "--outbox-dir", str(outbox_dir))[1]["modes"]["status"] == "ok"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_doctor_flags_a_file_owned_by_another_user(tmp_path: Path, pg_dsn: str, store: PgStore) -> None:
    """A checkpoint left by another user (a drain run as someone else): FAIL with the chown to run."""
    outbox_dir = bound_outbox(tmp_path / "outbox", store)
    os.chown(outbox_dir / "database.json", 65534, -1)
    code, checks = report("--dsn", pg_dsn, "--outbox-dir", str(outbox_dir))
    assert code == 1 and checks["modes"]["foreign"] == ["database.json"]
    assert checks["modes"]["action"].startswith("run `chown -R root ")


def test_doctor_flags_an_outbox_bound_to_another_database(tmp_path: Path, pg_dsn: str, empty_dsn: str,
                                                          store: PgStore) -> None:
    """An outbox bound to one database, checked against another migrated one: bound-to FAIL naming both."""
    outbox_dir = bound_outbox(tmp_path / "outbox", store)
    apply_migrations(empty_dsn)  # a second shardworker database, with its own instance id
    code, checks = report("--dsn", empty_dsn, "--outbox-dir", str(outbox_dir))
    assert code == 1
    bound = checks["bound-to"]
    assert bound["status"] == "fail" and bound["matches"] is False
    [(own,)] = query(pg_dsn, "SELECT current_database()")
    [(other,)] = query(empty_dsn, "SELECT current_database()")
    assert own in bound["detail"] and other in bound["detail"]
    assert report("--dsn", pg_dsn, "--outbox-dir", str(outbox_dir))[1]["bound-to"]["status"] == "ok"


def test_doctor_flags_a_quarantined_segment(tmp_path: Path, pg_dsn: str, store: PgStore) -> None:
    """A segment moved to quarantine/: FAIL naming it and `outbox verify`."""
    outbox_dir = bound_outbox(tmp_path / "outbox", store)
    pending_outcomes(outbox_dir, store, pg_dsn, 2)
    [segno] = list_segments(str(outbox_dir))[0]
    quarantine(str(outbox_dir), 0, segno)
    code, checks = report("--dsn", pg_dsn, "--outbox-dir", str(outbox_dir))
    assert code == 1
    assert checks["quarantine"]["quarantined"] == [f"shard-0000-{segno:010d}.seg"]
    assert "outbox verify" in checks["quarantine"]["action"]


def test_doctor_fails_when_the_outbox_disk_is_under_the_watermark(tmp_path: Path, pg_dsn: str,
                                                                  store: PgStore) -> None:
    """Less free space than --min-free-mb (the worker would stop claiming): disk FAIL."""
    outbox_dir = bound_outbox(tmp_path / "outbox", store)
    code, checks = report("--dsn", pg_dsn, "--outbox-dir", str(outbox_dir), "--min-free-mb", str(2**40))
    assert code == 1 and checks["disk"]["status"] == "fail"
    assert report("--dsn", pg_dsn, "--outbox-dir", str(outbox_dir), "--min-free-mb", "0")[1]["disk"]["status"] == "ok"


def test_doctor_missing_outbox_is_fine_unless_named(tmp_path: Path, pg_dsn: str) -> None:
    """No outbox at the default path: ok (nothing pending); a named directory that is missing: FAIL."""
    code, checks = report("--dsn", pg_dsn)
    assert code == 0 and checks["outbox"]["status"] == "ok" and checks["outbox"]["exists"] is False
    code, checks = report("--dsn", pg_dsn, "--outbox-dir", str(tmp_path / "typo"))
    assert code == 1 and checks["outbox"]["status"] == "fail"
    assert not (tmp_path / "typo").exists() and not (tmp_path / ".shardworker").exists()  # nothing created


# --- the console script -------------------------------------------------------------------


def test_console_script_from_a_project_dir_with_a_relative_outbox(tmp_path: Path, pg_dsn: str,
                                                                  store: PgStore) -> None:
    """`python -m shardworker doctor --outbox-dir outbox` in a project directory: exit 1 with
    the drain advice naming the relative path; drained as advised, exit 0."""
    project = tmp_path / "project"
    outbox_dir = bound_outbox(project / "outbox", store)
    pending_outcomes(outbox_dir, store, pg_dsn, 2)
    env = {k: v for k, v in os.environ.items() if k not in ("SHARDWORKER_DSN", "SHARDWORKER_OUTBOX_DIR")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "shardworker", *args, "--dsn", pg_dsn], cwd=project, env=env,
                              capture_output=True, text=True, timeout=60)

    first = run("doctor", "--outbox-dir", "outbox")
    assert first.returncode == 1, first.stdout + first.stderr
    [line] = [x for x in first.stdout.splitlines() if x.split()[1] == "pending"]
    assert line.startswith("FAIL") and "`shardworker outbox drain --outbox-dir outbox`" in line, line
    assert "1 check(s) need action" in first.stderr
    drained = run("outbox", "drain", "--outbox-dir", "outbox", "--timeout", "20")
    assert drained.returncode == 0, drained.stderr
    second = run("doctor", "--outbox-dir", "outbox")
    assert second.returncode == 0, second.stdout + second.stderr
    assert all(x.startswith("ok ") for x in second.stdout.splitlines()), second.stdout


def test_doctor_tells_outcomes_kept_aside(tmp_path: Path, pg_dsn: str, store: PgStore) -> None:
    """Outcomes the flusher kept rather than applied: a stale attempt's in stale.jsonl is by
    design (ok, counted); one whose job is missing from this database, set aside, needs a look
    (warn, naming setaside.jsonl). Before, doctor said nothing of either."""
    outbox_dir = bound_outbox(tmp_path / "outbox", store)
    assert report("--dsn", pg_dsn, "--outbox-dir", str(outbox_dir))[1]["kept"]["status"] == "ok"
    (outbox_dir / "stale.jsonl").write_text('{"reason":"stale: its attempt was rescued"}\n' * 2)
    kept = report("--dsn", pg_dsn, "--outbox-dir", str(outbox_dir))[1]["kept"]
    assert (kept["status"], kept["stale"], kept["set_aside"]) == ("ok", 2, 0)
    (outbox_dir / "setaside.jsonl").write_text('{"reason":"set aside: no such job in this database"}\n')
    kept = report("--dsn", pg_dsn, "--outbox-dir", str(outbox_dir))[1]["kept"]
    assert (kept["status"], kept["set_aside"]) == ("warn", 1) and "setaside.jsonl" in kept["action"]
