"""``shardworker doctor`` on a real PostgreSQL with real faults: a missing schema, a stopped
server, a refused port, a read-only database, pending outcomes with no worker, loose modes,
an outbox bound to another database, a silent worker, a quarantined segment, a full disk
(by the watermark); and once through the console script from a project directory."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from outbox import ShardWriter
from outbox.fsutil import ensure_dir
from outbox.recovery import quarantine
from outbox.segment import list_segments
from shardworker import binding
from shardworker.cli.main import main
from shardworker.doctor import Status, check_clock, check_schema
from shardworker.layout import lock_outbox
from shardworker.model import Outcome
from shardworker.store.embedded import EmbeddedPostgres
from shardworker.store.migrate import apply_migrations
from shardworker.store.pg_store import PgStore, ServerState, StoreConfig
from shardworker.store.schema import latest_version
from shardworker.wire import encode_outcome
from tests.helpers import enqueue, execute, query

REPO = Path(__file__).resolve().parents[2]
HEALTHY = ["database", "writable", "schema", "clock", "workers", "outbox", "modes", "disk", "pending", "bound-to",
           "quarantine"]


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, ["doctor", *args], env={"SHARDWORKER_DSN": None, "SHARDWORKER_OUTBOX_DIR": None})


def report(*args: str) -> tuple[int, dict[str, dict[str, Any]]]:
    """doctor --json: its exit code and its checks by name."""
    result = invoke("--json", *args)
    assert "Traceback" not in result.output, result.output
    doc = json.loads(result.stdout)
    assert doc["needs_action"] == (result.exit_code == 1), result.output
    return result.exit_code, {c["check"]: c for c in doc["checks"]}


def statuses(checks: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {name: c["status"] for name, c in checks.items()}


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run in an empty directory: the default outbox path (.shardworker/outbox) is relative."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def store(pg_dsn: str) -> Iterator[PgStore]:
    s = PgStore(StoreConfig(pg_dsn))
    yield s
    s.close()


def bound_outbox(directory: Path, store: PgStore) -> Path:
    """An outbox directory as a worker leaves it at its first start: 0700, bound to its database."""
    ensure_dir(str(directory))
    binding.bind(str(directory), store)
    return directory


def pending_outcomes(directory: Path, store: PgStore, dsn: str, count: int = 3) -> list[int]:
    """Claim ``count`` jobs and append their outcomes (fsync'd) to shard 0, as a child would;
    no worker is left running. Returns the job ids."""
    enqueue(dsn, "k", count)
    jobs = store.claim(["k"], None, "w-gone", count)
    with ShardWriter.open(str(directory), 0) as writer:
        for job in jobs:
            writer.append_bytes(encode_outcome(Outcome.done(job.id, job.attempt, b'{"r": 1}')))
        writer.commit()
    return [j.id for j in jobs]


def refused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- healthy -------------------------------------------------------------------------------


def test_doctor_on_a_healthy_setup_exits_0_with_every_check_ok(tmp_path: Path, pg_dsn: str, store: PgStore) -> None:
    """A migrated, writable database and a bound, empty 0700 outbox: every line ok, exit 0."""
    outbox_dir = bound_outbox(tmp_path / "outbox", store)
    result = invoke("--dsn", pg_dsn, "--outbox-dir", str(outbox_dir))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split()[1] for line in lines] == HEALTHY
    assert all(line.startswith("ok ") for line in lines), result.stdout
    code, checks = report("--dsn", pg_dsn, "--outbox-dir", str(outbox_dir))
    assert code == 0
    assert checks["schema"]["applied"] == checks["schema"]["needed"] == latest_version()
    assert abs(checks["clock"]["skew_s"]) < 5  # same host: the clocks agree
    assert checks["bound-to"]["matches"] is True


# --- database faults -----------------------------------------------------------------------


def test_doctor_on_a_database_without_the_schema_says_to_migrate(tmp_path: Path, empty_dsn: str) -> None:
    """An empty database: schema FAIL telling to run `shardworker migrate`, exit 1."""
    result = invoke("--dsn", empty_dsn, "--outbox-dir", str(tmp_path / "none"))
    assert result.exit_code == 1, result.output
    [line] = [x for x in result.stdout.splitlines() if x.split()[1] == "schema"]
    assert line.startswith("FAIL") and "run `shardworker migrate`" in line, line
    code, checks = report("--dsn", empty_dsn)
    assert code == 1
    assert checks["schema"]["status"] == "fail" and checks["schema"]["applied"] is None
    assert checks["database"]["status"] == checks["writable"]["status"] == "ok"


def test_doctor_with_the_server_stopped_still_reports_the_outbox(tmp_path: Path, private_pg: EmbeddedPostgres) -> None:
    """The server stopped: database FAIL within seconds, and the outbox still checked (its
    pending outcomes and the database it belongs to), no traceback."""
    dsn = private_pg.dsn
    store = PgStore(StoreConfig(dsn))
    outbox_dir = bound_outbox(tmp_path / "outbox", store)
    pending_outcomes(outbox_dir, store, dsn, 4)
    store.close()
    private_pg.stop("immediate")
    started = time.monotonic()
    code, checks = report("--dsn", dsn, "--outbox-dir", str(outbox_dir))
    assert time.monotonic() - started < 5
    assert code == 1
    assert checks["database"]["status"] == "fail" and "unreachable" in checks["database"]["detail"]
    assert "writable" not in checks and "schema" not in checks  # need the database
    assert checks["pending"]["status"] == "fail" and checks["pending"]["pending"] == 4
    assert "outbox drain" in checks["pending"]["action"]
    assert checks["bound-to"]["status"] == "warn" and checks["bound-to"]["matches"] is None


def test_doctor_on_a_refused_port_fails_fast_without_the_password(tmp_path: Path) -> None:
    """A refused connection: one FAIL line naming the server with the password hidden, exit 1."""
    dsn = f"postgresql://alice:hunter2@127.0.0.1:{refused_port()}/jobs"
    started = time.monotonic()
    result = invoke("--dsn", dsn, "--outbox-dir", str(tmp_path / "absent-but-default"))
    assert time.monotonic() - started < 5
    assert result.exit_code == 1
    assert "hunter2" not in result.output and "alice:***@127.0.0.1" in result.stdout
    assert result.stdout.splitlines()[0].startswith("FAIL  database   unreachable")
    assert "Traceback" not in result.output


def test_doctor_on_a_server_that_never_answers_gives_up_within_the_connect_bound(tmp_path: Path) -> None:
    """A port that accepts TCP but never speaks PostgreSQL (a hung server): FAIL after ~3 s, not a hang."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nobody ever reads or answers
        started = time.monotonic()
        code, checks = report("--dsn", f"postgresql://u@127.0.0.1:{silent.getsockname()[1]}/db")
        elapsed = time.monotonic() - started
    assert code == 1 and checks["database"]["status"] == "fail", checks
    assert 2 <= elapsed < 10, elapsed
    assert checks["outbox"]["status"] == "ok"  # still checked


def test_doctor_flags_a_read_only_database(pg_dsn: str) -> None:
    """default_transaction_read_only on: writable FAIL (the flusher could not apply anything)."""
    [(name,)] = query(pg_dsn, "SELECT current_database()")
    execute(pg_dsn, f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    code, checks = report("--dsn", pg_dsn)
    assert code == 1
    assert checks["writable"]["status"] == "fail" and "read-only" in checks["writable"]["detail"]
    assert checks["schema"]["status"] == "ok"


def test_doctor_warns_about_a_silent_worker_but_exits_0(pg_dsn: str) -> None:
    """A worker row whose heartbeat is five minutes old: workers warn naming it; a warning alone exits 0."""
    execute(pg_dsn, "INSERT INTO shardworker.workers (worker_id, hostname, pid, heartbeat_at) VALUES "
                    "('w-silent', 'host-a', 4242, now() - interval '5 minutes'), ('w-live', 'host-b', 77, now())")
    code, checks = report("--dsn", pg_dsn)
    assert code == 0
    assert checks["workers"]["status"] == "warn"
    assert checks["workers"]["silent"] == ["w-silent"]
    assert "w-silent on host-a" in checks["workers"]["detail"] and "w-live" not in checks["workers"]["detail"]


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
    fd = lock_outbox(str(outbox_dir))
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


# --- the checks as functions ---------------------------------------------------------------


def test_clock_skew_beyond_the_round_trip_and_5_s_warns() -> None:
    """30 s of skew warns; 2 s does not; a 12 s round trip leaves 6 s unknown, so 10 s of skew does not."""
    assert check_clock(ServerState(1030.0, 999.9, 1000.1, False, False)).status is Status.WARN
    assert check_clock(ServerState(1002.0, 999.9, 1000.1, False, False)).status is Status.OK
    assert check_clock(ServerState(1010.0, 994.0, 1006.0, False, False)).status is Status.OK
    behind = check_clock(ServerState(970.0, 1000.0, 1000.0, False, False))
    assert behind.status is Status.WARN and "behind" in behind.detail and behind.data["skew_s"] == -30.0


def test_schema_check_names_missing_and_unknown_versions() -> None:
    """A gap needs migrate (FAIL); a version this code does not know asks for an upgrade (warn)."""
    latest = latest_version()
    gap = check_schema(set(range(1, latest + 1)) - {2})
    assert gap.status is Status.FAIL and "missing 2" in gap.detail
    newer = check_schema(set(range(1, latest + 2)))
    assert newer.status is Status.WARN and str(latest + 1) in newer.detail


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
