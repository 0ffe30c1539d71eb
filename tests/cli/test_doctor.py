"""``shardworker doctor`` on a real PostgreSQL with real faults of the database: a missing
schema, a stopped server, a refused port, a server that never answers, a read-only
database, a silent worker; and the clock and schema checks as functions. Outbox faults
are in test_doctor_outbox.py."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from shardworker.core.views import Serving
from shardworker.doctor import Status, check_clock, check_schema
from shardworker.embedded import EmbeddedPostgres
from shardworker.store.pg_store import PgStore, ServerState, StoreConfig
from shardworker.store.schema import latest_version
from tests.cli.doctor_report import HEALTHY, bound_outbox, invoke, pending_outcomes, refused_port, report
from tests.helpers import enqueue, execute, query

pytestmark = pytest.mark.usefixtures("in_tmp_path")


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
    store = PgStore(StoreConfig(dsn=dsn))
    outbox_dir = bound_outbox(tmp_path / "outbox", store)
    pending_outcomes(outbox_dir, store, dsn, 4)
    store.close()
    private_pg.stop("immediate")
    started = time.monotonic()
    code, checks = report("--dsn", dsn, "--outbox-dir", str(outbox_dir))
    assert time.monotonic() - started < 60  # no retries with backoff: a refusal is reported at once
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
    assert time.monotonic() - started < 60  # no retries with backoff: a refusal is reported at once
    assert result.exit_code == 1
    assert "hunter2" not in result.output and "alice:***@127.0.0.1" in result.stdout
    assert result.stdout.splitlines()[0].startswith("FAIL  database    unreachable")
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
    assert 2 <= elapsed < 60, elapsed  # waited its 3 s connect bound, and not libpq's default: forever
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


def test_doctor_names_a_worker_of_this_host_that_is_gone_before_it_falls_silent(pg_dsn: str) -> None:
    """kill -9 of a worker: its row still beat a second ago, its jobs still read running; on
    its own host doctor sees its process is gone and says what to do, at once (not after the
    minute of silence the other hosts need)."""
    import socket
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    execute(pg_dsn, "INSERT INTO shardworker.workers (worker_id, hostname, pid, heartbeat_at, jobs_running) VALUES "
                    "('w-killed', %s, %s, now() - interval '1 second', 3), ('w-drain', %s, 0, now(), 0), "
                    "('w-elsewhere', 'host-b', %s, now(), 1)", socket.gethostname(), gone.pid,
            socket.gethostname(), gone.pid)
    code, checks = report("--dsn", pg_dsn)
    assert code == 0 and checks["workers"]["status"] == "warn", checks["workers"]
    assert checks["workers"]["gone"] == ["w-killed"]
    assert f"w-killed (pid {gone.pid}) is gone" in checks["workers"]["detail"]
    assert "outbox drain" in checks["workers"]["action"] and "restart" in checks["workers"]["action"]


def test_doctor_names_queued_kinds_no_live_worker_handles(pg_dsn: str, store: PgStore) -> None:
    """Queued jobs of a kind no live worker serves in their queue: kinds warns naming each with
    its count and how long its oldest has waited (exit 0: a worker may be on its way); a kind
    a live worker serves, or a finished job's kind, is not named."""
    enqueue(pg_dsn, "cuont", 3)
    enqueue(pg_dsn, "count", 2)
    enqueue(pg_dsn, "count", 1, queue="bulk")
    execute(pg_dsn, "UPDATE shardworker.jobs SET run_at = now() - interval '2 hours' WHERE kind = 'cuont'")
    store.heartbeat("w", "host", 1, serves=Serving(("count",), ("default",), 3600.0))
    code, checks = report("--dsn", pg_dsn)
    assert code == 0
    kinds = checks["kinds"]
    assert kinds["status"] == "warn", kinds
    assert "cuont (queue default): 3 queued, the oldest due 2h ago" in kinds["detail"], kinds
    assert "count (queue bulk): 1 queued" in kinds["detail"] and "count (queue default)" not in kinds["detail"]
    assert [(k["queue"], k["kind"], k["queued"]) for k in kinds["unserved"]] == [
        ("default", "cuont", 3), ("bulk", "count", 1)]
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'done' WHERE kind = 'cuont' OR queue = 'bulk'")
    code, checks = report("--dsn", pg_dsn)
    assert checks["kinds"]["status"] == "ok" and checks["kinds"]["unserved"] == [], checks["kinds"]


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
