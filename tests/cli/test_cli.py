"""The command line through click's CliRunner (and once as a real subprocess), on a real
PostgreSQL: migrate, exit codes and one-line errors, stats and ``run``'s options.
Enqueue and the outbox commands are in test_cli_enqueue.py and test_cli_outbox.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardworker.cli.main import main
from shardworker.core.views import FlowCount
from shardworker.store.pg_store import PgStore
from tests.cli.cli_runner import REPO, assert_one_line_error, invoke, rows
from tests.helpers import enqueue, execute

CONSOLE = Path(sys.executable).parent / "shardworker"

# --- migrate ------------------------------------------------------------------------------


def test_migrate_applies_then_reports_nothing_to_do(empty_dsn: str) -> None:
    """The first migrate lists the files it applied; the second applies none."""
    first = invoke("migrate", "--dsn", empty_dsn)
    assert first.exit_code == 0, first.output
    files = sorted(p.name for p in (REPO / "migrations").glob("[0-9][0-9][0-9][0-9]_*.sql"))
    assert len(files) >= 3
    assert first.stdout == f"applied {len(files)} migration(s): {', '.join(files)}\n"
    second = invoke("migrate", "--dsn", empty_dsn)
    assert second.exit_code == 0, second.output
    assert second.stdout == "applied 0 migration(s)\n"
    assert rows(empty_dsn) == []


def test_commands_on_unmigrated_database_fail_with_one_line(empty_dsn: str) -> None:
    """stats and enqueue on a database without the schema exit 1 telling to run migrate."""
    assert_one_line_error(invoke("stats", "--dsn", empty_dsn), "shardworker migrate")
    assert_one_line_error(invoke("enqueue", "k", "--dsn", empty_dsn), "shardworker migrate")


def test_unreachable_database_fails_with_one_line_without_password() -> None:
    """A refused connection exits 1 with one line that never shows the password."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = invoke("stats", "--dsn", f"postgresql://alice:hunter2@127.0.0.1:{port}/jobs?connect_timeout=2")
    assert_one_line_error(result, "unavailable")
    assert "hunter2" not in result.output


@pytest.mark.parametrize("args", [
    ["enqueue"],
    ["enqueue", "k", "--count", "0"],
    ["enqueue", "k", "--max-attempts", "0"],
    ["enqueue", "k", "--delay", "-1"],
    ["enqueue", "k", "--count", "2", "--dedupe-key", "x"],
    ["enqueue", "k", "--file", "-"],
    ["enqueue", "--file", "/nonexistent/jobs.jsonl"],
    ["stats", "--bogus"],
    ["run"],
    ["no-such-command"],
    ["outbox", "drain", "--timeout", "-5"],
])
def test_usage_errors_exit_2(pg_dsn: str, args: list[str]) -> None:
    """Bad or missing arguments exit 2 with a usage message and touch nothing."""
    dsn = ["--dsn", pg_dsn] if args[0] in ("enqueue", "stats", "run") else []
    result = invoke(*args, *dsn, input="")
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Usage:" in result.stderr
    assert "Traceback" not in result.output
    assert rows(pg_dsn) == []


# --- stats ----------------------------------------------------------------------------------


def stats_command(*args: str, dsn: str) -> str:
    """``shardworker stats ...`` through the console script, as an operator runs it; its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "SHARDWORKER_DSN"}
    done = subprocess.run([str(CONSOLE), "stats", *args, "--dsn", dsn], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_stats_splits_unfinished_jobs_as_the_backlog_does(pg_dsn: str, store: PgStore) -> None:
    """Queued jobs due now (available) apart from those due later (scheduled); claimed jobs a
    live worker reports not started (prefetched) apart from started ones (running); then done,
    failed, cancelled; per total and per queue. --json keeps queued (available + scheduled) and
    running (claimed) and adds the split, the started count as ``started``."""
    enqueue(pg_dsn, "k", 3)
    enqueue(pg_dsn, "k", 2, queue="mail")
    enqueue(pg_dsn, "k", 1, queue="mail", run_at=datetime.now(UTC) + timedelta(hours=1))
    [finished] = enqueue(pg_dsn, "report", 1, queue="old")
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'done', finished_at = now() WHERE id = %s", finished)
    assert len(store.claim(["k"], ["mail"], "w1", 2)) == 2
    store.heartbeat("w1", "host", 1, 2, 0, [FlowCount("mail", "k", 1, 1)])
    lines = stats_command(dsn=pg_dsn).splitlines()
    assert lines == ["available=3  scheduled=1  prefetched=1  running=1  done=1  failed=0  cancelled=0",
                     "  default: available=3", "  mail: scheduled=1  prefetched=1  running=1", "  old: done=1"]
    as_json = json.loads(stats_command("--json", dsn=pg_dsn))
    assert as_json["total"] == {"waiting": 0, "queued": 4, "running": 2, "done": 1, "failed": 0, "cancelled": 0,
                                "available": 3, "scheduled": 1, "prefetched": 1, "started": 1}
    assert as_json["queues"]["mail"] == {"waiting": 0, "queued": 1, "running": 2, "done": 0, "failed": 0,
                                         "cancelled": 0, "available": 0, "scheduled": 1, "prefetched": 1, "started": 1}
    assert sorted(as_json["queues"]) == ["default", "mail", "old"] and as_json["estimated"] == []


def test_stats_on_a_big_table_counts_all_but_done_exactly(pg_dsn: str, store: PgStore) -> None:
    """Past the size where counting every row is slow, stats counts queued, running,
    failed and cancelled through their partial indexes and estimates done from the
    planner's statistics (forced here with a threshold of 0 rows)."""
    execute(pg_dsn, "INSERT INTO shardworker.jobs (kind, queue, status, finished_at) "
                    "SELECT 'k', CASE WHEN g % 4 = 0 THEN 'mail' ELSE 'default' END, "
                    "CASE WHEN g % 100 = 0 THEN 'failed' WHEN g % 100 = 1 THEN 'cancelled' "
                    "WHEN g % 100 = 2 THEN 'queued' ELSE 'done' END, now() FROM generate_series(1, 20000) g")
    execute(pg_dsn, "ANALYZE shardworker.jobs")
    exact, estimated = store.job_counts()
    assert not estimated
    rows, estimated = store.job_counts(exact_up_to=0)
    assert estimated
    truth = {(q, s): n for q, s, n in exact}
    got = {(q, s): n for q, s, n in rows}
    assert {k: v for k, v in got.items() if k[1] != "done"} == {k: v for k, v in truth.items() if k[1] != "done"}
    for queue in ("default", "mail"):
        assert abs(got[(queue, "done")] - truth[(queue, "done")]) <= 0.1 * truth[(queue, "done")]
    text = invoke("stats", "--exact", "--json", "--dsn", pg_dsn)
    assert json.loads(text.stdout)["total"]["done"] == sum(n for (_, s), n in truth.items() if s == "done")


# --- a real subprocess ----------------------------------------------------------------------


def test_python_m_shardworker_enqueue_then_stats(tmp_path: Path, pg_dsn: str) -> None:
    """``python -m shardworker enqueue`` then ``stats --json`` work as real processes."""
    env = {k: v for k, v in os.environ.items() if k not in ("SHARDWORKER_DSN", "SHARDWORKER_OUTBOX_DIR")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "shardworker", *args, "--dsn", pg_dsn], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)

    enqueued = run("enqueue", "sub.kind", '{"x": 1}', "--count", "3", "--queue", "subq")
    assert enqueued.returncode == 0, enqueued.stderr
    assert enqueued.stdout.startswith("enqueued 3 jobs: ")
    stats = run("stats", "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["queues"]["subq"]["queued"] == 3
    assert json.loads(stats.stdout)["total"]["queued"] == 3
    bad = run("enqueue", "sub.kind", "{nope")
    assert bad.returncode == 1
    assert bad.stderr.startswith("error: ") and len(bad.stderr.splitlines()) == 1
    assert not (tmp_path / ".shardworker").exists()  # --dsn given: no embedded server


def test_migrate_print_after_a_version_that_does_not_exist_is_a_usage_error() -> None:
    from shardworker.store.schema import latest_version

    latest = latest_version()
    refused = invoke("migrate", "--print", "--after", str(latest + 1))
    assert refused.exit_code == 2 and f"there is no version {latest + 1}" in refused.output
    nothing = invoke("migrate", "--print", "--after", str(latest))
    assert nothing.exit_code == 0 and "BEGIN" not in nothing.stdout
    assert f"no migrations after version {latest}, the latest" in nothing.stderr


def test_run_names_its_options_when_rescue_after_is_too_short(pg_dsn: str, tmp_path: Path) -> None:
    result = invoke("run", "--app", "counting_app", "--shutdown-timeout", "4000", "--outbox-dir",
                    str(tmp_path / "o"), "--dsn", pg_dsn)
    assert result.exit_code == 2
    assert "Invalid value for --rescue-after: 3600s must be longer than --shutdown-timeout (4000s)" in result.output
    assert "rescue_after_s" not in result.output


def test_run_refuses_a_default_timeout_that_is_not_a_duration(pg_dsn: str, tmp_path: Path) -> None:
    """--default-timeout (and SHARDWORKER_DEFAULT_TIMEOUT) take a duration: anything else is a usage error."""
    result = invoke("run", "--app", "counting_app", "--default-timeout", "soon", "--outbox-dir",
                    str(tmp_path / "o"), "--dsn", pg_dsn)
    assert result.exit_code == 2 and "'soon' is not a duration" in result.output
    from_env = CliRunner().invoke(main, ["run", "--app", "counting_app", "--outbox-dir", str(tmp_path / "o"),
                                         "--dsn", pg_dsn], env={"SHARDWORKER_DEFAULT_TIMEOUT": "-5"})
    assert from_env.exit_code == 2 and "'-5' is not a duration" in from_env.output
    assert not (tmp_path / "o").exists()
