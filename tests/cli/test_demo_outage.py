"""``shardworker demo --outage`` as a user runs it: the console script from a project
directory, its own embedded PostgreSQL stopped and started for real, and a final table
whose counts come from the handler's own ledger."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from shardworker.embedded import EmbeddedPostgres
from tests.cli.test_project_dir import shardworker_script


def table_rows(stdout: str) -> dict[str, str]:
    rows = [line for line in stdout.splitlines() if line and not line.startswith("-")]
    return {line[:22].strip(): line[22:].strip() for line in rows}


def test_the_outage_demo_reruns_nothing(tmp_path: Path) -> None:
    try:
        run_the_demo_twice(tmp_path)
    finally:
        EmbeddedPostgres(tmp_path / ".shardworker" / "outage-demo" / "pgdata").stop("immediate")


def command_lines_while(proc: subprocess.Popen[str]) -> list[bytes]:
    """Every process command line on the machine, sampled every 50 ms until ``proc`` exits
    (what any local user can read in /proc)."""
    seen: set[bytes] = set()
    while proc.poll() is None:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    seen.add((entry / "cmdline").read_bytes())
        time.sleep(0.05)
    return sorted(seen)


def run_the_demo_twice(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SHARDWORKER_DSN")}
    proc = subprocess.Popen([*shardworker_script(), "demo", "--outage", "--jobs", "400", "--outage-seconds", "1.5"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    command_lines = command_lines_while(proc)
    stdout, stderr = proc.communicate(timeout=240)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    # The demo's superuser password is in no process's argv (readable by every local user),
    # and the demo's server is stopped when it ends.
    demo_dir = tmp_path / ".shardworker" / "outage-demo"
    password = (demo_dir / "password").read_text().strip().encode()
    assert any(b"shardworker.demo.app" in line for line in command_lines)  # the worker was seen
    assert not [line for line in command_lines if password in line]
    assert password not in (demo_dir / "worker.log").read_bytes()
    assert not EmbeddedPostgres(demo_dir / "pgdata").is_running()
    rows = table_rows(done.stdout)
    assert (rows["jobs"], rows["handler runs"], rows["re-runs"], rows["final rows"]) == ("400", "400", "0", "done 400")
    assert float(rows["PostgreSQL down"].split()[0]) >= 1.5
    assert int(rows["outcomes that waited"].split()[0].replace(",", "")) > 0
    # Not a terminal: the phases only, no progress line redrawn in place.
    assert "\r" not in done.stderr and "stopping PostgreSQL mid-run" in done.stderr
    ledger = tmp_path / ".shardworker" / "outage-demo" / "ledger"
    runs = [line.split()[0] for f in ledger.iterdir() for line in f.read_text().splitlines()]
    assert len(runs) == len(set(runs)) == 400
    # A second run starts afresh on the same server.
    again = subprocess.run([*shardworker_script(), "demo", "--outage", "--jobs", "50", "--outage-seconds", "0.5"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stderr[-3000:]
    assert table_rows(again.stdout)["final rows"] == "done 50"


def test_the_outage_demo_refuses_a_dsn(tmp_path: Path) -> None:
    refused = subprocess.run([*shardworker_script(), "demo", "--outage", "--dsn", "postgresql://app@db/app"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert "runs only on an embedded server of its own: drop --dsn" in refused.stderr
    assert not (tmp_path / ".shardworker").exists()


def test_an_outage_demo_that_fails_at_its_start_still_stops_its_postgresql(tmp_path: Path) -> None:
    """The demo's database cannot be migrated (a table in the way): one error line, exit 1, and
    the server the demo started is stopped again."""
    server = EmbeddedPostgres(tmp_path / ".shardworker" / "outage-demo" / "pgdata")
    try:
        server.start()
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA shardworker; CREATE TABLE shardworker.jobs (odd int)")
        server.stop()
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SHARDWORKER_DSN")}
        failed = subprocess.run([*shardworker_script(), "demo", "--outage"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=120)
        assert failed.returncode == 1 and failed.stderr.splitlines()[-1].startswith("error: "), failed.stderr
        assert "Traceback" not in failed.stderr
        assert not server.is_running()
    finally:
        server.stop("immediate")


# Ctrl-C as a terminal delivers it: a test run in a shell's background job (`pytest &`, as CI
# scripts may do) inherits SIGINT ignored, and so would the demo, which then never sees it.
AS_IN_A_TERMINAL = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                                          "os.execv(sys.argv[1], sys.argv[1:])"]


def test_an_interrupted_outage_demo_brings_postgresql_back_and_runs_again(tmp_path: Path) -> None:
    """Ctrl-C while PostgreSQL is down: the demo starts it again so the worker's outcomes land,
    stops the worker, and exits; the next run starts afresh (draining anything left)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SHARDWORKER_DSN")}
    try:
        # An outage of ten minutes (the most it takes): only the interrupt ends this demo in the wait below.
        demo = subprocess.Popen([*AS_IN_A_TERMINAL, *shardworker_script(), "demo", "--outage", "--jobs", "2000",
                                 "--outage-seconds", "600"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        assert demo.stderr is not None
        for line in demo.stderr:
            if "stopping PostgreSQL mid-run" in line:
                break
        time.sleep(1.0)
        demo.send_signal(signal.SIGINT)
        _, err = demo.communicate(timeout=150)
        assert demo.returncode == 1 and "Aborted!" in err, err
        assert "starting PostgreSQL again, so the worker can store its outcomes" in err
        assert not EmbeddedPostgres(tmp_path / ".shardworker" / "outage-demo" / "pgdata").is_running()
        again = subprocess.run([*shardworker_script(), "demo", "--outage", "--jobs", "100", "--outage-seconds", "0.5"],
                               cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
        assert again.returncode == 0, again.stderr[-3000:]
        assert table_rows(again.stdout)["final rows"] == "done 100"
    finally:
        EmbeddedPostgres(tmp_path / ".shardworker" / "outage-demo" / "pgdata").stop("immediate")
