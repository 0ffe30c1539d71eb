"""The console script as a new user met it on day two: ``enqueue`` says which job it made,
``jobs wait`` exits 1 when the job ended failed or cancelled, ``jobs list`` has a header,
and every time printed is in one zone (UTC), whatever the session's time zone."""

from __future__ import annotations

import json
import os
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from tests.cli.test_project_dir import shardworker_script
from tests.helpers import execute, query


def sw(dsn: str, *args: str, code: int = 0, tz: str | None = None, stdin: str | None = None,
       cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``shardworker ARGS --dsn DSN`` as a user runs it; ``tz`` sets the session's time zone (PGTZ)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SHARDWORKER_DSN", "PGTZ")}
    if tz:
        env["PGTZ"] = tz
    done = subprocess.run([*shardworker_script(), *args, "--dsn", dsn], env=env, input=stdin, cwd=cwd,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == code, (args, done.returncode, done.stdout, done.stderr)
    return done


def test_enqueue_prints_the_id_of_each_job_it_made(pg_dsn: str, tmp_path: Path) -> None:
    one = sw(pg_dsn, "enqueue", "thumbnail", '{"a": 1}').stdout
    [(first,)] = query(pg_dsn, "SELECT id FROM shardworker.jobs")
    assert one == f"enqueued 1 job: {first}\n"
    assert sw(pg_dsn, "enqueue", "k", "--dedupe-key", "daily").stdout.startswith("enqueued 1 job: ")
    assert sw(pg_dsn, "enqueue", "k", "--dedupe-key", "daily").stdout == \
        "enqueued 0 jobs: a live job holds dedupe key 'daily'\n"
    three = sw(pg_dsn, "enqueue", "k", "--count", "3").stdout
    ids = [i for (i,) in query(pg_dsn, "SELECT id FROM shardworker.jobs ORDER BY id")][-3:]
    assert three == f"enqueued 3 jobs: {', '.join(map(str, ids))}\n"
    lines = '{"kind": "k", "dedupe_key": "daily"}\n{"kind": "k"}\n'
    bulk = sw(pg_dsn, "enqueue", "--file", "-", stdin=lines).stdout
    [(last,)] = query(pg_dsn, "SELECT max(id) FROM shardworker.jobs")
    assert bulk == f"enqueued 1 job: {last} (1 skipped: a live job holds its dedupe key)\n"
    many = sw(pg_dsn, "enqueue", "k", "--count", "40").stdout
    made = [i for (i,) in query(pg_dsn, "SELECT id FROM shardworker.jobs ORDER BY id")][-40:]
    assert many == f"enqueued 40 jobs: ids {made[0]} to {made[-1]} (--json lists each)\n"
    as_json = json.loads(sw(pg_dsn, "enqueue", "k", "--count", "2", "--json").stdout)
    assert as_json["enqueued"] == 2 and len(as_json["ids"]) == 2


def test_jobs_wait_exits_1_when_the_job_ended_failed_or_cancelled(pg_dsn: str) -> None:
    done, failed, cancelled = (json.loads(sw(pg_dsn, "enqueue", "k", "--json").stdout)["ids"][0] for _ in range(3))
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'done', finished_at = now() WHERE id = %s", done)
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'failed', finished_at = now(), last_error = 'boom' "
                    "WHERE id = %s", failed)
    sw(pg_dsn, "jobs", "cancel", str(cancelled))
    assert "status: done" in sw(pg_dsn, "jobs", "wait", str(done), "--timeout", "1").stdout
    ended = sw(pg_dsn, "jobs", "wait", str(failed), "--timeout", "1", code=1)
    assert "status: failed" in ended.stdout and ended.stderr == f"job {failed} ended failed: boom\n"
    ended = sw(pg_dsn, "jobs", "wait", str(cancelled), "--timeout", "1", "--json", code=1)
    assert json.loads(ended.stdout)["status"] == "cancelled"
    assert ended.stderr == f"job {cancelled} ended cancelled: cancelled by an operator\n"


def test_jobs_list_prints_a_header(pg_dsn: str) -> None:
    sw(pg_dsn, "enqueue", "k", "--count", "2")
    lines = sw(pg_dsn, "jobs", "list").stdout.splitlines()
    assert lines[0].split() == ["id", "status", "kind", "queue", "attempts", "created", "(UTC)", "last", "error"]
    assert len(lines) == 3
    assert lines[0].index("status") == lines[1].index("queued")  # the header is over its column
    assert json.loads(sw(pg_dsn, "jobs", "list", "--json").stdout)[0]["kind"] == "k"  # --json has none
    nothing = sw(pg_dsn, "jobs", "list", "--status", "failed")
    assert nothing.stdout == "" and nothing.stderr == "no jobs match\n"


def test_times_print_in_utc_whatever_the_sessions_zone(pg_dsn: str) -> None:
    """With PGTZ=Asia/Kolkata (+05:30) every time printed is UTC: jobs list, jobs show (text
    and --json), and workers."""
    [job_id] = json.loads(sw(pg_dsn, "enqueue", "k", "--json").stdout)["ids"]
    [(created,)] = query(pg_dsn, "SELECT created_at FROM shardworker.jobs")
    utc = created.astimezone(UTC)
    listed = sw(pg_dsn, "jobs", "list", tz="Asia/Kolkata").stdout
    assert f"{utc:%Y-%m-%d %H:%M:%S}" in listed
    shown = json.loads(sw(pg_dsn, "jobs", "show", str(job_id), "--json", tz="Asia/Kolkata").stdout)
    assert shown["created_at"] == utc.isoformat() and shown["run_at"].endswith("+00:00")
    text = sw(pg_dsn, "jobs", "show", str(job_id), tz="Asia/Kolkata").stdout
    assert f"created_at: {utc.isoformat()}" in text and "+05:30" not in text
    execute(pg_dsn, "INSERT INTO shardworker.workers (worker_id, hostname, pid, started_at, heartbeat_at) "
                    "VALUES ('w-1', 'host', 1, %s, now())", datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC))
    workers = sw(pg_dsn, "workers", tz="Asia/Kolkata").stdout
    assert "2030-01-02 03:04:05" in workers and re.search(r"started \(UTC\)", workers)
    assert json.loads(sw(pg_dsn, "workers", "--json", tz="Asia/Kolkata").stdout)[0]["started_at"] == \
        "2030-01-02T03:04:05+00:00"


def test_workers_show_the_slots_a_dead_worker_holds_and_forget_gives_them_back(pg_dsn: str) -> None:
    """A worker killed while it held 2 slots of a kind capped across workers: `workers --all`
    shows them, released once it is silent past its --release-slots-after; `workers forget`
    refuses a live worker with one line, and gives the dead one's jobs back."""
    execute(pg_dsn, "INSERT INTO shardworker.kinds (name, global_concurrency, key_concurrency) VALUES ('api', 5, 3)")
    execute(pg_dsn, "INSERT INTO shardworker.workers (worker_id, hostname, pid, heartbeat_at, slots_after_s) "
                    "VALUES ('w-dead', 'host', 1, now() - interval '90 seconds', 10), "
                    "('w-live', 'host', 2, now(), 10)")
    execute(pg_dsn, "INSERT INTO shardworker.jobs (kind, status, attempt, locked_by, key) "
                    "SELECT 'api', 'running', 1, 'w-dead', 'acme' FROM generate_series(1, 2)")
    listed = sw(pg_dsn, "workers", "--all").stdout
    assert re.search(r"w-dead .* key acme 2, kind api 2 \(released\)  SILENT", listed), listed
    assert re.search(r"w-live .* -$", listed, re.MULTILINE), listed
    [dead] = [w for w in json.loads(sw(pg_dsn, "workers", "--all", "--json").stdout) if w["worker_id"] == "w-dead"]
    assert dead["slots"] == {"kind:api": 2, "key:acme": 2} and dead["slots_released"] is True
    refused = sw(pg_dsn, "workers", "forget", "w-live", code=1)
    assert refused.stderr.count("\n") == 1 and "it is live" in refused.stderr
    assert "no worker 'w-gone'" in sw(pg_dsn, "workers", "forget", "w-gone", code=1).stderr
    assert sw(pg_dsn, "workers", "forget", "w-dead").stdout == \
        "forgot worker w-dead: 2 jobs given back (they may run again in 300s)\n"
    assert query(pg_dsn, "SELECT DISTINCT status, locked_by, run_at > now() + interval '290 seconds' "
                         "FROM shardworker.jobs") == [("queued", None, True)]  # the grace, as a rescue's
    assert [w["worker_id"] for w in json.loads(sw(pg_dsn, "workers", "--all", "--json").stdout)] == ["w-live"]
