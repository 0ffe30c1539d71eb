"""The command line through click's CliRunner (and once as a real subprocess), on a real
PostgreSQL: exit codes, one-line errors, bulk enqueue, stats and the outbox commands."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result
from psycopg import sql

from outbox import ShardWriter
from outbox.frame import HEADER_SIZE
from outbox.segment import list_segments, scan_file
from shardworker.cli.main import main
from shardworker.layout import lock_outbox
from shardworker.model import ClaimedJob, Outcome
from shardworker.store.pg_store import PgStore, StoreConfig
from shardworker.wire import encode_outcome
from tests.helpers import execute

REPO = Path(__file__).resolve().parents[2]


def invoke(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=input, env={"SHARDWORKER_DSN": None,
                                                                  "SHARDWORKER_OUTBOX_DIR": None})


def assert_one_line_error(result: Result, *fragments: str) -> None:
    """Exit 1, nothing on stdout, exactly one ``error: ...`` line on stderr naming every fragment."""
    assert result.exit_code == 1, (result.exit_code, result.output)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def rows(dsn: str, where: str = "TRUE") -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute(sql.SQL("SELECT * FROM shardworker.jobs WHERE {} ORDER BY id").format(sql.SQL(where)))
        return cur.fetchall()


@pytest.fixture
def store(pg_dsn: str) -> Iterator[PgStore]:
    s = PgStore(StoreConfig(pg_dsn))
    yield s
    s.close()


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


# --- enqueue --------------------------------------------------------------------------------


def test_enqueue_one_job_prints_one_and_stores_it(pg_dsn: str) -> None:
    """enqueue KIND PAYLOAD_JSON prints 1 and inserts a queued row with that payload."""
    result = invoke("enqueue", "thumbnail", '{"a":1}', "--dsn", pg_dsn)
    assert result.exit_code == 0, result.output
    assert result.stdout == "1\n"
    [job] = rows(pg_dsn)
    assert (job["kind"], job["payload"], job["queue"], job["status"], job["attempt"], job["max_attempts"]) == (
        "thumbnail", {"a": 1}, "default", "queued", 0, 25)


def test_enqueue_count_and_options_apply_to_every_copy(pg_dsn: str) -> None:
    """--count 5 with --queue, --priority, --max-attempts and --delay inserts 5 such rows."""
    result = invoke("enqueue", "k", "[1,2]", "--count", "5", "--queue", "q9", "--priority", "-3",
                    "--max-attempts", "2", "--delay", "600", "--dsn", pg_dsn)
    assert result.exit_code == 0, result.output
    assert result.stdout == "5\n"
    jobs = rows(pg_dsn, "run_at > now() + interval '500 seconds'")
    assert len(jobs) == 5
    assert {(j["queue"], j["priority"], j["max_attempts"], json.dumps(j["payload"])) for j in jobs} == {
        ("q9", -3, 2, "[1, 2]")}


def test_enqueue_without_payload_stores_null(pg_dsn: str) -> None:
    """KIND alone enqueues a job whose payload is JSON null."""
    assert invoke("enqueue", "k", "--dsn", pg_dsn).stdout == "1\n"
    assert rows(pg_dsn)[0]["payload"] is None


def test_enqueue_dedupe_key_skips_a_live_duplicate(pg_dsn: str) -> None:
    """A second enqueue with the same live --dedupe-key prints 0 and inserts nothing."""
    assert invoke("enqueue", "k", "--dedupe-key", "x1", "--dsn", pg_dsn).stdout == "1\n"
    assert invoke("enqueue", "k", "--dedupe-key", "x1", "--dsn", pg_dsn).stdout == "0\n"
    assert len(rows(pg_dsn)) == 1


def test_enqueue_bad_payload_json_exits_1_with_one_line(pg_dsn: str) -> None:
    """Invalid PAYLOAD_JSON exits 1 with a single error line and enqueues nothing."""
    assert_one_line_error(invoke("enqueue", "k", "{a:1", "--dsn", pg_dsn), "PAYLOAD_JSON is not valid JSON")
    assert rows(pg_dsn) == []


def test_enqueue_file_is_all_or_nothing_naming_the_bad_line(tmp_path: Path, pg_dsn: str) -> None:
    """A JSONL file whose line 3 is invalid exits 1 naming line 3, and enqueues none of its lines."""
    path = tmp_path / "jobs.jsonl"
    path.write_text('{"kind": "a", "payload": 1}\n{"kind": "b", "payload": 2}\n{"kind": "c", "payload": \n'
                    '{"kind": "d"}\n')
    assert_one_line_error(invoke("enqueue", "--file", str(path), "--dsn", pg_dsn), "line 3", "invalid JSON")
    path.write_text('{"kind": "a"}\n\n{"kind": "b", "colour": "red"}\n')
    assert_one_line_error(invoke("enqueue", "--file", str(path), "--dsn", pg_dsn), "line 3", "colour")
    path.write_text('{"kind": "a"}\n{"kind": "b"}\n{"kind": "c", "max_attempts": 0}\n')
    assert_one_line_error(invoke("enqueue", "--file", str(path), "--dsn", pg_dsn), "line 3", "max_attempts")
    assert rows(pg_dsn) == []


def test_enqueue_file_from_stdin_with_all_fields(pg_dsn: str) -> None:
    """--file - reads JSONL from stdin, honours every per-line field and prints the count."""
    lines = [
        {"kind": "a", "payload": {"n": 1}},
        {"kind": "b", "payload": [1], "queue": "q2", "priority": 7, "max_attempts": 3,
         "run_at": "2099-01-01T00:00:00+00:00", "dedupe_key": "d1"},
        {"kind": "c", "payload": None, "dedupe_key": "d1"},  # skipped: d1 is live
    ]
    result = invoke("enqueue", "--file", "-", "--dsn", pg_dsn, input="".join(json.dumps(o) + "\n" for o in lines))
    assert result.exit_code == 0, result.output
    assert result.stdout == "2\n"
    a, b = rows(pg_dsn)
    assert (a["kind"], a["payload"], a["queue"], a["priority"], a["max_attempts"]) == ("a", {"n": 1}, "default",
                                                                                         0, 25)
    assert (b["kind"], b["payload"], b["queue"], b["priority"], b["max_attempts"], b["dedupe_key"]) == (
        "b", [1], "q2", 7, 3, "d1")
    assert b["run_at"].year == 2099


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


def test_stats_counts_jobs_by_status_and_queue(pg_dsn: str, store: PgStore) -> None:
    """stats prints totals per status and per queue; --json prints the same as JSON."""
    assert invoke("enqueue", "k", "--count", "3", "--dsn", pg_dsn).exit_code == 0
    assert invoke("enqueue", "k", "--count", "2", "--queue", "mail", "--dsn", pg_dsn).exit_code == 0
    store.claim(["k"], ["mail"], "w1", 1)
    text = invoke("stats", "--dsn", pg_dsn)
    assert text.exit_code == 0, text.output
    assert text.stdout.splitlines() == ["queued=4  running=1  done=0  failed=0  cancelled=0",
                                        "  default: queued=3", "  mail: queued=1  running=1"]
    as_json = invoke("stats", "--json", "--dsn", pg_dsn)
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout) == {
        "total": {"queued": 4, "running": 1, "done": 0, "failed": 0, "cancelled": 0},
        "queues": {"default": {"queued": 3}, "mail": {"queued": 1, "running": 1}}, "estimated": []}


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


# --- outbox -------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["status", "verify"])
def test_outbox_inspection_of_missing_dir_fails_with_one_line(tmp_path: Path, command: str) -> None:
    """outbox status/verify on a directory that does not exist exit 1 with one line naming it."""
    missing = str(tmp_path / "nope")
    assert_one_line_error(invoke("outbox", command, "--outbox-dir", missing), f"no outbox directory at {missing}")
    assert not os.path.exists(missing)


def test_outbox_drain_of_missing_dir_fails_with_one_line(tmp_path: Path, pg_dsn: str) -> None:
    """outbox drain on a directory that does not exist exits 1 with one line naming it."""
    missing = str(tmp_path / "nope")
    result = invoke("outbox", "drain", "--outbox-dir", missing, "--dsn", pg_dsn, "--timeout", "1")
    assert result.exit_code == 1, result.output
    assert f"error: no outbox directory at {missing}" in result.stderr
    assert "Traceback" not in result.output


def write_outcomes(directory: Path, outcomes: list[Outcome], shards: int = 2) -> None:
    """Append each outcome, in wire format, to shard ``i % shards`` as a worker's children would."""
    for shard in range(shards):
        mine = [o for i, o in enumerate(outcomes) if i % shards == shard]
        if not mine:
            continue
        with ShardWriter.open(str(directory), shard) as writer:
            for outcome in mine:
                writer.append_bytes(encode_outcome(outcome))
            writer.commit()


def claim(store: PgStore, pg_dsn: str, count: int, worker: str = "w1") -> list[ClaimedJob]:
    assert invoke("enqueue", "k", '{"x": 1}', "--count", str(count), "--dsn", pg_dsn).exit_code == 0
    jobs = store.claim(["k"], None, worker, count)
    assert len(jobs) == count
    return jobs


def test_outbox_status_json_counts_pending_outcomes_per_shard(tmp_path: Path, pg_dsn: str, store: PgStore) -> None:
    """outbox status --json reports every fsync'd outcome as pending, per shard, without a database."""
    jobs = claim(store, pg_dsn, 5)
    outbox_dir = tmp_path / "outbox"
    write_outcomes(outbox_dir, [Outcome.done(j.id, j.attempt, b'{"r": 1}') for j in jobs])
    result = invoke("outbox", "status", "--json", "--outbox-dir", str(outbox_dir))
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["pending"] == 5
    assert report["worker_running"] is False and report["flusher_running"] is False
    assert report["quarantined"] == [] and report["torn_tails"] == []
    assert [(s["shard"], s["pending"], s["writer_alive"]) for s in report["shards"]] == [(0, 3, False),
                                                                                        (1, 2, False)]
    assert all(s["bytes"] > 0 and s["oldest_age_s"] is not None for s in report["shards"])
    text = invoke("outbox", "status", "--outbox-dir", str(outbox_dir))
    assert text.exit_code == 0
    assert "5 pending; worker not running" in text.stdout


def test_outbox_drain_applies_pending_outcomes(tmp_path: Path, pg_dsn: str, store: PgStore) -> None:
    """outbox drain applies every outcome (fenced: a re-claimed job's old outcome is stale) and exits 0."""
    jobs = claim(store, pg_dsn, 4)
    outcomes = [Outcome.done(j.id, j.attempt, json.dumps({"id": j.id}).encode()) for j in jobs[:3]]
    outcomes.append(Outcome.failed(jobs[3].id, jobs[3].attempt, "boom"))
    outcomes.append(Outcome.done(jobs[0].id, 99, b'"never"'))  # an attempt that never existed
    outbox_dir = tmp_path / "outbox"
    write_outcomes(outbox_dir, outcomes)
    result = invoke("outbox", "drain", "--outbox-dir", str(outbox_dir), "--dsn", pg_dsn, "--timeout", "10")
    assert result.exit_code == 0, result.output
    assert "drained 5 outcomes: 4 applied, 0 already applied, 1 stale, 0 set aside, 0 dead-lettered" in result.stdout
    final = {r["id"]: r for r in rows(pg_dsn)}
    for job in jobs[:3]:
        assert (final[job.id]["status"], final[job.id]["result"]) == ("done", {"id": job.id})
    assert (final[jobs[3].id]["status"], final[jobs[3].id]["last_error"]) == ("failed", "boom")
    after = json.loads(invoke("outbox", "status", "--json", "--outbox-dir", str(outbox_dir)).stdout)
    assert after["pending"] == 0
    again = invoke("outbox", "drain", "--outbox-dir", str(outbox_dir), "--dsn", pg_dsn, "--timeout", "10")
    assert again.exit_code == 0
    assert "drained 0 outcomes" in again.stdout


def test_outbox_drain_refuses_while_a_worker_holds_the_outbox(tmp_path: Path, pg_dsn: str, store: PgStore) -> None:
    """drain exits 1 with a clear one-line message while the worker lock is held, and applies nothing."""
    jobs = claim(store, pg_dsn, 2)
    outbox_dir = tmp_path / "outbox"
    write_outcomes(outbox_dir, [Outcome.done(j.id, j.attempt, b"1") for j in jobs])
    fd = lock_outbox(str(outbox_dir))
    try:
        status = json.loads(invoke("outbox", "status", "--json", "--outbox-dir", str(outbox_dir)).stdout)
        assert status["worker_running"] is True
        result = invoke("outbox", "drain", "--outbox-dir", str(outbox_dir), "--dsn", pg_dsn, "--timeout", "2")
        assert result.exit_code == 1, result.output
        assert result.stdout == ""
        errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and "holds the outbox" in errors[0], result.stderr
        assert "Traceback" not in result.output
        assert {r["status"] for r in rows(pg_dsn)} == {"running"}
    finally:
        os.close(fd)
    result = invoke("outbox", "drain", "--outbox-dir", str(outbox_dir), "--dsn", pg_dsn, "--timeout", "10")
    assert result.exit_code == 0, result.output
    assert {r["status"] for r in rows(pg_dsn)} == {"done"}


def test_outbox_verify_passes_clean_segments_and_fails_on_corruption(tmp_path: Path) -> None:
    """verify exits 0 on clean sealed segments and 1 once a byte in the middle of one is flipped."""
    outbox_dir = tmp_path / "outbox"
    with ShardWriter.open(str(outbox_dir), 0) as writer:
        for i in range(6):
            outcome = Outcome.done(i + 1, 1, json.dumps({"i": i, "pad": "x" * 40}).encode())
            writer.append_bytes(encode_outcome(outcome))
            writer.commit()
    clean = invoke("outbox", "verify", "--outbox-dir", str(outbox_dir))
    assert clean.exit_code == 0, clean.output
    assert "ok: 1 segment(s), 0 torn tail(s)" in clean.stdout
    assert "6 records, sealed" in clean.stdout
    [segno] = list_segments(str(outbox_dir))[0]
    scan = scan_file(str(outbox_dir), 0, segno)
    assert scan.sealed and len(scan.data) == 6
    middle = scan.data[3]
    offset = middle.offset + HEADER_SIZE + len(middle.payload) // 2
    path = outbox_dir / f"shard-0000-{segno:010d}.seg"
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    result = invoke("outbox", "verify", "--outbox-dir", str(outbox_dir))
    assert result.exit_code == 1, result.output
    assert result.stdout == (f"corrupt  shard-0000-{segno:010d}.seg (3 records) at offset {middle.offset}: "
                             "invalid frame followed by valid frames\n")
    assert result.stderr.splitlines() == [f"error: 1 corrupt or quarantined segment(s) in {outbox_dir}"]


def test_outbox_drain_fails_naming_a_quarantined_segment(tmp_path: Path, pg_dsn: str, store: PgStore) -> None:
    """drain applies the outcomes before a corrupt record, then exits 1 naming the quarantined segment."""
    jobs = claim(store, pg_dsn, 6)
    outbox_dir = tmp_path / "outbox"
    with ShardWriter.open(str(outbox_dir), 0) as writer:
        for job in jobs:
            outcome = Outcome.done(job.id, job.attempt, b'{"pad": "xxxxxxxxxxxxxxxx"}')
            writer.append_bytes(encode_outcome(outcome))
            writer.commit()
    [segno] = list_segments(str(outbox_dir))[0]
    victim = scan_file(str(outbox_dir), 0, segno).data[3]
    path = outbox_dir / f"shard-0000-{segno:010d}.seg"
    data = bytearray(path.read_bytes())
    data[victim.offset + HEADER_SIZE + 2] ^= 0x40
    path.write_bytes(bytes(data))
    result = invoke("outbox", "drain", "--outbox-dir", str(outbox_dir), "--dsn", pg_dsn, "--timeout", "10")
    assert result.exit_code == 1, result.output
    assert "drained 3 outcomes: 3 applied" in result.stdout
    name = f"shard-0000-{segno:010d}.seg"
    assert f"error: 1 quarantined segment(s) in {outbox_dir}/quarantine" in result.stderr
    assert name in result.stderr
    assert [r["status"] for r in rows(pg_dsn)] == ["done"] * 3 + ["running"] * 3
    status = invoke("outbox", "status", "--outbox-dir", str(outbox_dir))
    assert f"QUARANTINED {name}" in status.stdout


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
    assert enqueued.stdout == "3\n"
    stats = run("stats", "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["queues"] == {"subq": {"queued": 3}}
    assert json.loads(stats.stdout)["total"]["queued"] == 3
    bad = run("enqueue", "sub.kind", "{nope")
    assert bad.returncode == 1
    assert bad.stderr.startswith("error: ") and len(bad.stderr.splitlines()) == 1
    assert not (tmp_path / ".shardworker").exists()  # --dsn given: no embedded server


def test_enqueue_file_takes_command_line_options_as_defaults(pg_dsn: str) -> None:
    """--queue/--priority/--max-attempts/--delay fill what a line leaves out; a line's own fields win."""
    lines = '{"kind": "a"}\n{"kind": "b", "queue": "own", "priority": 9}\n'
    result = invoke("enqueue", "--file", "-", "--queue", "bulk", "--priority", "3", "--max-attempts", "4",
                    "--delay", "600", "--dsn", pg_dsn, input=lines)
    assert result.exit_code == 0, result.output
    got = {r["kind"]: (r["queue"], r["priority"], r["max_attempts"]) for r in rows(pg_dsn)}
    assert got == {"a": ("bulk", 3, 4), "b": ("own", 9, 4)}
    assert [r[0] for r in psycopg.connect(pg_dsn).execute(
        "SELECT run_at > now() + interval '5 minutes' FROM shardworker.jobs").fetchall()] == [True, True]


def test_enqueue_file_rejects_a_nul_payload_naming_the_line(pg_dsn: str) -> None:
    """A payload PostgreSQL jsonb cannot store is rejected before anything is sent, naming its line."""
    lines = '{"kind": "a"}\n{"kind": "a", "payload": "\\u0000"}\n'
    result = invoke("enqueue", "--file", "-", "--dsn", pg_dsn, input=lines)
    assert result.exit_code == 1
    assert result.stderr.startswith("error: line 2: payload holds a NUL character")
    assert rows(pg_dsn) == []


@pytest.mark.parametrize("delay", ["nan", "inf", "-inf", "1e300"])
def test_enqueue_delay_that_is_not_a_duration_is_a_usage_error(pg_dsn: str, delay: str) -> None:
    """--delay nan/inf/huge exits 2 with one line, no traceback, and enqueues nothing."""
    result = invoke("enqueue", "k", "--delay", delay, "--dsn", pg_dsn)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "--delay" in result.output
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM shardworker.jobs").fetchone() == (0,)


def test_enqueue_json_names_the_new_job(pg_dsn: str) -> None:
    """One job: its id, so `jobs show ID` can follow; a live dedupe key: none; bulk: the count."""
    first = invoke("enqueue", "k", '{"a": 1}', "--dedupe-key", "d1", "--json", "--dsn", pg_dsn)
    assert first.exit_code == 0, first.output
    [job] = rows(pg_dsn)
    assert json.loads(first.stdout) == {"enqueued": 1, "ids": [job["id"]]}
    again = invoke("enqueue", "k", "--dedupe-key", "d1", "--json", "--dsn", pg_dsn)
    assert json.loads(again.stdout) == {"enqueued": 0, "ids": []}
    assert invoke("enqueue", "k", "--dedupe-key", "d1", "--dsn", pg_dsn).stdout == "0\n"
    bulk = invoke("enqueue", "k", "--count", "3", "--json", "--dsn", pg_dsn)
    assert json.loads(bulk.stdout) == {"enqueued": 3}
    assert len(rows(pg_dsn)) == 4


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
