"""A stop signal that comes while the worker is still starting: during the import of a big app
(a web framework takes seconds), before any child or connection exists. A deploy or an autoscaler
sends SIGTERM whenever it likes, so the worker must stop as it would later: exit 0, no job
claimed, no handler run. A second signal still exits at once."""

from __future__ import annotations

import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardworker.cli.main import main as cli
from shardworker.embedded import EmbeddedPostgres
from tests.cli.test_project_dir import shardworker_script
from tests.helpers import STARTED, enqueue, query, start_worker, wait_for, worker_log

APP = '''
    """An app whose import takes a while, as a web framework's does; it says when it begins."""
    import os
    import time

    from shardworker import App

    open("var/importing", "w").close()
    time.sleep(float(os.environ.get("SLOW_IMPORT_S", "1.5")))

    app = App()


    @app.handler("note")
    def note(job):
        fd = os.open("var/ledger.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{job.id} {job.attempt}\\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "webapp"
    (root / "var").mkdir(parents=True)
    (root / "slowtasks.py").write_text(textwrap.dedent(APP).lstrip())
    return root


def start(project: Path, dsn: str, import_s: float) -> subprocess.Popen[str]:
    """``shardworker run`` from the project directory, once its app has begun importing."""
    proc = subprocess.Popen([*shardworker_script(), "run", "--app", "slowtasks", "--procs", "2",
                             "--outbox-dir", "var/outbox", "--dsn", dsn],
                            cwd=project, env={"PATH": "/usr/bin:/bin", "SLOW_IMPORT_S": str(import_s),
                                              "PYTHONPATH": str(project)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    STARTED.append(proc)  # type: ignore[arg-type]  # killed after the test, even a failed one
    wait_for(lambda: (project / "var" / "importing").exists(), 30, "the app's import to begin", step_s=0.01)
    return proc


def test_sigterm_while_the_app_imports_stops_cleanly_before_claiming(project: Path, pg_dsn: str) -> None:
    ids = enqueue(pg_dsn, "note", 3)
    proc = start(project, pg_dsn, import_s=1.5)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, output
    assert "signal 15" in output and "worker stopped" in output, output
    assert not (project / "var" / "ledger.log").exists(), "a handler ran after the stop signal"
    rows = query(pg_dsn, "SELECT id, status, attempt FROM shardworker.jobs ORDER BY id")
    assert rows == [(job_id, "queued", 0) for job_id in ids]


def test_second_signal_while_the_app_imports_exits_at_once(project: Path, pg_dsn: str) -> None:
    enqueue(pg_dsn, "note", 1)
    proc = start(project, pg_dsn, import_s=30)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=10)
    assert time.monotonic() - sent < 5, "the second signal waited for the app's import"
    assert proc.returncode == 1, output
    assert query(pg_dsn, "SELECT status, attempt FROM shardworker.jobs") == [("queued", 0)]


def test_a_run_in_process_puts_the_signal_handlers_back(pg_dsn: str, tmp_path: Path) -> None:
    """``shardworker run`` invoked in-process (click's runner, a program's own entry point): the
    handlers it holds signals with while starting are not left behind once it returns."""
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    result = CliRunner().invoke(cli, ["run", "--app", "no_such_module_here", "--outbox-dir", str(tmp_path / "o"),
                                      "--dsn", pg_dsn])
    assert result.exit_code == 1 and "no_such_module_here" in result.output, result.output
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_sigterm_while_the_start_waits_out_an_outage_exits_0(private_pg: EmbeddedPostgres, tmp_path: Path) -> None:
    """Started while PostgreSQL is down, the worker retries its first checks; a SIGTERM then is
    a stop like any other (exit 0, at once), not the outage's error (exit 1)."""
    counts = tmp_path / "counts"
    counts.mkdir()
    private_pg.stop("immediate")
    proc = start_worker(private_pg.dsn, tmp_path / "outbox", counts, "--backoff-cap", "30", procs=2)
    wait_for(lambda: "retrying" in worker_log(counts), 30, "the start waiting out the outage")
    time.sleep(1.0)  # into the backoff's sleep
    asked = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(30)
    assert code == 0, worker_log(counts)
    assert time.monotonic() - asked < 3, "the stop waited for the backoff"
    assert "error:" not in worker_log(counts)


def test_a_stop_does_not_hide_a_start_error_that_is_no_outage(empty_dsn: str, tmp_path: Path) -> None:
    """Only an outage being waited out ends quietly on a stop; an error a retry would not cure
    (here the schema missing: `shardworker migrate` never ran) is still raised, stop or not."""
    from shardworker.core.retry import Backoff
    from shardworker.errors import SchemaMissing
    from shardworker.store.pg_store import PgStore, StoreConfig
    from shardworker.worker.startup import Startup
    from tests.helpers import worker_config

    store = PgStore(StoreConfig(dsn=empty_dsn))
    try:
        startup = Startup(worker_config(dsn=empty_dsn, outbox_dir=str(tmp_path)), store, None,  # type: ignore[arg-type]
                          lambda: Backoff(0.01, 0.05), stopping=lambda: True)
        with pytest.raises(SchemaMissing), startup.stoppable():
            startup.check_schema()
    finally:
        store.close()
