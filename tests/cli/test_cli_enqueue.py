"""``shardworker enqueue`` through click's CliRunner on a real PostgreSQL: one job, copies
and options, dedupe keys, bulk JSONL files (all or nothing), and its ``--json``."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from tests.cli.cli_runner import assert_one_line_error, invoke, rows

# --- enqueue --------------------------------------------------------------------------------


def test_enqueue_one_job_prints_one_and_stores_it(pg_dsn: str) -> None:
    """enqueue KIND PAYLOAD_JSON prints the job it made and inserts a queued row with that payload."""
    result = invoke("enqueue", "thumbnail", '{"a":1}', "--dsn", pg_dsn)
    assert result.exit_code == 0, result.output
    [job] = rows(pg_dsn)
    assert result.stdout == f"enqueued 1 job: {job['id']}\n"
    assert (job["kind"], job["payload"], job["queue"], job["status"], job["attempt"], job["max_attempts"]) == (
        "thumbnail", {"a": 1}, "default", "queued", 0, 25)


def test_enqueue_count_and_options_apply_to_every_copy(pg_dsn: str) -> None:
    """--count 5 with --queue, --priority, --max-attempts and --delay inserts 5 such rows."""
    result = invoke("enqueue", "k", "[1,2]", "--count", "5", "--queue", "q9", "--priority", "-3",
                    "--max-attempts", "2", "--delay", "600", "--dsn", pg_dsn)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("enqueued 5 jobs: ")
    jobs = rows(pg_dsn, "run_at > now() + interval '500 seconds'")
    assert len(jobs) == 5
    assert {(j["queue"], j["priority"], j["max_attempts"], json.dumps(j["payload"])) for j in jobs} == {
        ("q9", -3, 2, "[1, 2]")}


def test_enqueue_without_payload_stores_null(pg_dsn: str) -> None:
    """KIND alone enqueues a job whose payload is JSON null."""
    assert invoke("enqueue", "k", "--dsn", pg_dsn).stdout.startswith("enqueued 1 job: ")
    assert rows(pg_dsn)[0]["payload"] is None


def test_enqueue_dedupe_key_skips_a_live_duplicate(pg_dsn: str) -> None:
    """A second enqueue with the same live --dedupe-key says so and inserts nothing."""
    assert invoke("enqueue", "k", "--dedupe-key", "x1", "--dsn", pg_dsn).stdout.startswith("enqueued 1 job: ")
    assert invoke("enqueue", "k", "--dedupe-key", "x1", "--dsn", pg_dsn).stdout == \
        "enqueued 0 jobs: a live job holds dedupe key 'x1'\n"
    assert len(rows(pg_dsn)) == 1


def test_an_empty_dedupe_key_is_refused_not_shared(pg_dsn: str) -> None:
    """`--dedupe-key "$KEY"` with KEY unset made '' a key like any other: the second job of an
    unrelated script was skipped as a duplicate (found by a new user). An empty key is refused,
    here and from Python, and nothing is enqueued."""
    from shardworker import EnqueueError, enqueue

    assert_one_line_error(invoke("enqueue", "k", "--dedupe-key", "", "--dsn", pg_dsn), "dedupe_key", "empty")
    with pytest.raises(EnqueueError, match="empty"):
        enqueue(pg_dsn, "k", dedupe_key="")
    with pytest.raises(EnqueueError, match="white space"):  # "$A $B" with both unset
        enqueue(pg_dsn, "k", dedupe_key=" ")
    assert rows(pg_dsn) == []


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
    """--file - reads JSONL from stdin, honours every per-line field and prints the count, the
    ids and the lines a live dedupe key skipped."""
    lines = [
        {"kind": "a", "payload": {"n": 1}},
        {"kind": "b", "payload": [1], "queue": "q2", "priority": 7, "max_attempts": 3,
         "run_at": "2099-01-01T00:00:00+00:00", "dedupe_key": "d1"},
        {"kind": "c", "payload": None, "dedupe_key": "d1"},  # skipped: d1 is live
    ]
    result = invoke("enqueue", "--file", "-", "--dsn", pg_dsn, input="".join(json.dumps(o) + "\n" for o in lines))
    assert result.exit_code == 0, result.output
    a, b = rows(pg_dsn)
    assert result.stdout == f"enqueued 2 jobs: {a['id']}, {b['id']} (1 skipped: a live job holds its dedupe key)\n"
    assert (a["kind"], a["payload"], a["queue"], a["priority"], a["max_attempts"]) == ("a", {"n": 1}, "default",
                                                                                         0, 25)
    assert (b["kind"], b["payload"], b["queue"], b["priority"], b["max_attempts"], b["dedupe_key"]) == (
        "b", [1], "q2", 7, 3, "d1")
    assert b["run_at"].year == 2099


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
    """One job: its id, so `jobs show ID` can follow; a live dedupe key: none; bulk: every id."""
    first = invoke("enqueue", "k", '{"a": 1}', "--dedupe-key", "d1", "--json", "--dsn", pg_dsn)
    assert first.exit_code == 0, first.output
    [job] = rows(pg_dsn)
    assert json.loads(first.stdout) == {"enqueued": 1, "ids": [job["id"]]}
    again = invoke("enqueue", "k", "--dedupe-key", "d1", "--json", "--dsn", pg_dsn)
    assert json.loads(again.stdout) == {"enqueued": 0, "ids": []}
    bulk = invoke("enqueue", "k", "--count", "3", "--json", "--dsn", pg_dsn)
    assert json.loads(bulk.stdout) == {"enqueued": 3, "ids": [r["id"] for r in rows(pg_dsn)][1:]}
    assert len(rows(pg_dsn)) == 4


@pytest.mark.parametrize("queue", ["a,b", "new\nline", "tab\there", "para\u2029graph", " padded", "padded "])
def test_enqueue_refuses_a_queue_name_no_worker_could_be_given(pg_dsn: str, queue: str) -> None:
    """`run --queues` takes comma-separated names, trimmed: a job in a queue named with a comma
    or space at either end could never be claimed by a worker given its queue, and a control
    character breaks the `queues` table. Such a name is refused at enqueue, one line, nothing
    written; from Python and from the App's periodic jobs too."""
    from shardworker import App, JobSpec
    from shardworker.errors import ConfigError, EnqueueError

    assert_one_line_error(invoke("enqueue", "k", "--queue", queue, "--dsn", pg_dsn), "queue name")
    assert rows(pg_dsn) == []
    with pytest.raises(EnqueueError, match="queue name"):
        JobSpec("k", None, queue=queue)
    with pytest.raises(ConfigError, match="queue name"):
        App().periodic("* * * * *", kind="tick", queue=queue)


@pytest.mark.parametrize("after", ["0", "false", '""', "null", "12", '{"id": 1}'])
def test_a_file_line_whose_after_is_not_a_list_of_ids_is_refused(tmp_path: Path, pg_dsn: str, after: str) -> None:
    """``"after": 0`` (or false, "", null) silently dropped the dependency, and the job ran at
    once (issue 41, 12): anything but a list of ids is refused, naming the line, and nothing is
    enqueued."""
    path = tmp_path / "jobs.jsonl"
    path.write_text(f'{{"kind": "a"}}\n{{"kind": "b", "after": {after}}}\n')
    assert_one_line_error(invoke("enqueue", "--file", str(path), "--dsn", pg_dsn), "line 2",
                          "after must be a list of job ids")
    assert rows(pg_dsn) == []


def test_a_rate_of_thousands_of_digits_is_a_one_line_usage_error(pg_dsn: str) -> None:
    """`queues limit q --rate <4,301 digits>/s` printed a traceback (issue 41, 11)."""
    result = invoke("queues", "limit", "q", "--rate", "9" * 4301 + "/s", "--dsn", pg_dsn)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "rate must look like 10/s" in result.output and len(result.output) < 600
