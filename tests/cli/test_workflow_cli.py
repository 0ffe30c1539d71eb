"""A small workflow as a user builds it: a project directory with its app module, jobs
enqueued with the console script (``--after``, ``--file`` lines with ``after``), a worker run
with ``--exit-when-idle``; then what ``jobs show``, ``jobs list --status waiting`` and
``stats`` say. Handlers count their runs in a ledger they fsync."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.cli.project_cli import make_project, run_in
from tests.cli.test_project_dir import shardworker_script
from tests.conftest import free_port
from tests.helpers import query, wait_for
from tests.worker.test_observability import scrape

APP = '''
    """A document split into pages, each page read, then one merge after all of them."""
    import os

    from shardworker import App

    app = App()


    def ledger(job):
        fd = os.open("ledger/runs.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{job.kind} {job.id} {job.attempt}\\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)


    @app.handler("split")
    def split(job):
        ledger(job)
        pages = [job.enqueue("page", {"n": n}) for n in range(job.payload["pages"])]
        job.enqueue("merge", {"doc": job.payload["doc"]}, after=pages)
        return {"pages": len(pages)}


    @app.handler("page")
    def page(job):
        ledger(job)
        return {"text": f"page {job.payload['n']}"}


    @app.handler("merge")
    def merge(job):
        ledger(job)
        return {"texts": sorted(r["text"] for r in job.dependencies.values())}
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path, "docs-app", APP)


def sw(project: Path, dsn: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_in(project, dsn, *args, stdin=stdin)


def test_a_fan_out_and_fan_in_through_the_console_script(project: Path, pg_dsn: str) -> None:
    made = sw(project, pg_dsn, "enqueue", "split", '{"doc": "a", "pages": 4}', "--json")
    assert made.returncode == 0, made.stderr
    (split_id,) = json.loads(made.stdout)["ids"]
    # A job of the user's own waits on the split with --after.
    after = sw(project, pg_dsn, "enqueue", "page", '{"n": 99}', "--after", str(split_id), "--json")
    assert after.returncode == 0, after.stderr
    (late_id,) = json.loads(after.stdout)["ids"]
    waiting = sw(project, pg_dsn, "jobs", "list", "--status", "waiting", "--json")
    assert [j["id"] for j in json.loads(waiting.stdout)] == [late_id]
    assert "waiting=1" in sw(project, pg_dsn, "stats").stdout

    run = sw(project, pg_dsn, "run", "--app", "tasks", "--outbox-dir", "outbox", "--procs", "2", "--exit-when-idle")
    assert run.returncode == 0, run.stderr[-3000:]
    assert dict(query(pg_dsn, "SELECT kind, count(*) FROM shardworker.jobs WHERE status = 'done' GROUP BY kind")) \
        == {"split": 1, "page": 5, "merge": 1}
    runs = (project / "ledger" / "runs.log").read_text().split()
    assert len(runs) == 3 * 7  # every handler once
    (merge_id, result) = query(pg_dsn, "SELECT id, result FROM shardworker.jobs WHERE kind = 'merge'")[0]
    assert result == {"texts": [f"page {n}" for n in range(4)]}
    shown = json.loads(sw(project, pg_dsn, "jobs", "show", str(merge_id), "--json").stdout)
    assert len(shown["dependencies"]) == 4 and {d["status"] for d in shown["dependencies"]} == {"done"}
    assert shown["dependents"] == []
    text = sw(project, pg_dsn, "jobs", "show", str(split_id)).stdout
    assert "waited on by: 1" in text and f"  {late_id}  page  done" in text


def test_after_a_missing_job_is_one_line_and_enqueues_nothing(project: Path, pg_dsn: str) -> None:
    refused = sw(project, pg_dsn, "enqueue", "page", "{}", "--after", "424242")
    assert refused.returncode == 1
    assert refused.stderr.strip() == "error: after: job 424242 does not exist; nothing was enqueued"
    bad = sw(project, pg_dsn, "enqueue", "page", "{}", "--after", "1,x")
    assert bad.returncode == 2 and "--after" in bad.stderr
    lines = '{"kind": "page", "payload": {"n": 1}}\n{"kind": "merge", "after": [424242]}\n'
    from_file = sw(project, pg_dsn, "enqueue", "--file", "-", stdin=lines)
    assert from_file.returncode == 1 and "424242" in from_file.stderr
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs") == [(0,)]


def test_one_job_fans_out_ten_thousand_follow_ups_and_one_merge_after_all(project: Path, pg_dsn: str) -> None:
    made = sw(project, pg_dsn, "enqueue", "split", '{"doc": "big", "pages": 10000}')
    assert made.returncode == 0, made.stderr
    run = sw(project, pg_dsn, "run", "--app", "tasks", "--outbox-dir", "outbox", "--procs", "2", "--exit-when-idle")
    assert run.returncode == 0, run.stderr[-3000:]
    assert dict(query(pg_dsn, "SELECT status, count(*) FROM shardworker.jobs GROUP BY status")) == {"done": 10002}
    (texts,) = query(pg_dsn, "SELECT jsonb_array_length(result->'texts') FROM shardworker.jobs WHERE kind = 'merge'")[0]
    assert texts == 10000
    assert len((project / "ledger" / "runs.log").read_text().splitlines()) == 10002


def test_the_metrics_count_follow_ups_inserted(project: Path, pg_dsn: str) -> None:
    sw(project, pg_dsn, "enqueue", "split", '{"doc": "m", "pages": 3}')
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SHARDWORKER_DSN")}
    worker = subprocess.Popen([*shardworker_script(), "run", "--app", "tasks", "--outbox-dir", "outbox", "--procs", "2",
                               "--metrics-port", str(port), "--dsn", pg_dsn], cwd=project, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: query(pg_dsn, "SELECT status FROM shardworker.jobs WHERE kind = 'merge'") == [("done",)], 60,
                 "the merge done")
        wait_for(lambda: scrape(port).get(("shardworker_followups_inserted_total", ())) == 4, 10,
                 "4 follow-ups counted")
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
