"""Input edges, each one line and exit 1 or 2 with nothing changed, or carried exactly:
integers beyond 64 bits, invalid UTF-8 from argv and files, huge durations, the literal
text ``\\u0000``, naive times, on a real PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from shardworker.cli.main import main
from shardworker.client import EnqueueError, enqueue, enqueue_many, parse_jsonl
from tests.helpers import REPO, execute, query

BIG = 18446744073709551616  # 2**64: beyond what orjson (and handlers) read as an integer
CONSOLE = Path(sys.executable).parent / "shardworker"


def invoke(*args: str, input: str | bytes | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=input, env={"SHARDWORKER_DSN": None,
                                                                  "SHARDWORKER_OUTBOX_DIR": None})


def assert_one_line(result: Result, *fragments: str, codes: tuple[int, ...] = (1,)) -> None:
    assert result.exit_code in codes, (result.exit_code, result.output)
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    error_lines = [line for line in lines if line.startswith("error:") or line.startswith("Error:")]
    assert len(error_lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in error_lines[0], error_lines[0]


def job_count(dsn: str) -> int:
    return int(query(dsn, "SELECT count(*) FROM shardworker.jobs")[0][0])


@pytest.mark.parametrize("payload", [f'{{"n": {BIG}}}', f"[{-(2**63) - 1}]", f'{{"a": [1, {10**30}]}}'])
def test_an_integer_beyond_64_bits_is_refused_at_enqueue_not_made_a_float(pg_dsn: str, payload: str) -> None:
    assert_one_line(invoke("enqueue", "k", payload, "--dsn", pg_dsn), "integer", "64 bits")
    lines = f'{{"kind": "a"}}\n{{"kind": "a", "payload": {payload}}}\n'
    assert_one_line(invoke("enqueue", "--file", "-", "--dsn", pg_dsn, input=lines), "line 2", "64 bits")
    assert job_count(pg_dsn) == 0


def test_64_bit_integers_at_both_ends_are_carried_exactly(pg_dsn: str) -> None:
    payload = f'{{"max": {2**64 - 1}, "min": {-(2**63)}, "digits": "{BIG}"}}'
    assert invoke("enqueue", "k", payload, "--dsn", pg_dsn).exit_code == 0
    [(stored,)] = query(pg_dsn, "SELECT payload::text FROM shardworker.jobs")
    assert json.loads(stored) == {"max": 2**64 - 1, "min": -(2**63), "digits": str(BIG)}


def test_python_payloads_with_an_integer_beyond_64_bits_are_refused_in_one_line(pg_dsn: str) -> None:
    with pytest.raises(EnqueueError, match="64 bits"):
        enqueue(pg_dsn, "k", {"n": BIG})
    with pytest.raises(EnqueueError, match=r"line 1: .*64 bits"):
        parse_jsonl([f'{{"kind": "k", "payload": {BIG}}}'])
    assert job_count(pg_dsn) == 0


def test_jobs_show_and_list_print_a_stored_integer_beyond_64_bits_exactly(pg_dsn: str) -> None:
    execute(pg_dsn, "INSERT INTO shardworker.jobs (kind, payload, status, result, finished_at) "
                    "VALUES ('k', %s::jsonb, 'done', %s::jsonb, now())", f'{{"n": {BIG}}}', f"[{-(10**40)}]")
    [(job_id,)] = query(pg_dsn, "SELECT id FROM shardworker.jobs")
    shown = invoke("jobs", "show", str(job_id), "--json", "--dsn", pg_dsn)
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["payload"] == {"n": BIG} and json.loads(shown.stdout)["result"] == [-(10**40)]
    text = invoke("jobs", "show", str(job_id), "--dsn", pg_dsn)
    assert text.exit_code == 0 and str(BIG) in text.stdout and str(-(10**40)) in text.stdout, text.output
    listed = invoke("jobs", "list", "--json", "--dsn", pg_dsn)
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout)[0]["payload"] == {"n": BIG}


def console(*args: bytes, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDWORKER_")}
    env["PYTHONPATH"] = str(REPO)
    exe = str(CONSOLE) if CONSOLE.exists() else "shardworker"
    return subprocess.run([exe.encode(), *args], input=input, capture_output=True, timeout=60, env=env,
                          cwd=REPO)


def assert_console_one_line(done: subprocess.CompletedProcess[bytes], *fragments: str) -> None:
    err = done.stderr.decode(errors="replace")
    assert done.returncode in (1, 2), (done.returncode, err)
    assert "Traceback" not in err, err
    error_lines = [line for line in err.splitlines() if line.lower().startswith("error:")]
    assert len(error_lines) == 1, err
    for fragment in fragments:
        assert fragment in error_lines[0], error_lines[0]


@pytest.mark.parametrize("args", [
    [b"enqueue", b"k\xff"],
    [b"enqueue", b"k", b"--queue", b"q\xfe\xff"],
    [b"enqueue", b"k", b"--dedupe-key", b"d\xff"],
    [b"enqueue", b"k", b'{"a": "\xff"}'],
    [b"jobs", b"list", b"--kind", b"k\xff"],
    [b"jobs", b"list", b"--queue", b"q\xff"],
    [b"jobs", b"retry", b"--failed", b"--kind", b"k\xff"],
])
def test_invalid_utf8_on_the_command_line_is_one_line(pg_dsn: str, args: list[bytes]) -> None:
    assert_console_one_line(console(*args, b"--dsn", pg_dsn.encode()), "UTF-8")
    assert job_count(pg_dsn) == 0


@pytest.mark.parametrize("line", [b'{"kind": "k\xff"}', b'{"kind": "k", "queue": "\xc3"}',
                                  b'{"kind": "k", "payload": "\\udcff"}'])
def test_invalid_utf8_in_a_file_line_is_one_line_naming_it(pg_dsn: str, tmp_path: Path, line: bytes) -> None:
    path = tmp_path / "jobs.jsonl"
    path.write_bytes(b'{"kind": "ok"}\n' + line + b"\n")
    done = console(b"enqueue", b"--file", str(path).encode(), b"--dsn", pg_dsn.encode())
    assert_console_one_line(done, "line 2")
    assert job_count(pg_dsn) == 0


@pytest.mark.parametrize("args", [
    ["jobs", "list", "--since", "99999999999d"],
    ["jobs", "list", "--since", "99999999999999w"],
    ["prune", "--older-than", "99999999999999w"],
    ["workers", "--silent-after", "99999999999999w"],
])
def test_a_duration_beyond_what_postgresql_and_python_hold_is_one_line(pg_dsn: str, args: list[str]) -> None:
    result = invoke(*args, "--dsn", pg_dsn)
    assert_one_line(result, "duration", "100 years", codes=(1, 2))
    assert job_count(pg_dsn) == 0


def test_a_retention_beyond_what_postgresql_holds_is_refused_before_the_worker_starts(pg_dsn: str,
                                                                                       tmp_path: Path) -> None:
    done = console(b"run", b"--app", b"shardworker.demo.app", b"--exit-when-idle", b"--outbox-dir",
                   str(tmp_path / "outbox").encode(), b"--retention", b"99999999999999w", b"--dsn", pg_dsn.encode())
    assert_console_one_line(done, "--retention", "duration")
    assert not (tmp_path / "outbox").exists()


def test_the_literal_text_backslash_u0000_is_accepted_and_a_real_nul_refused(pg_dsn: str) -> None:
    literal = r'{"path": "C:\\u0000", "k\\u0000": 1}'  # the six characters \u0000, twice
    assert invoke("enqueue", "k", literal, "--dsn", pg_dsn).exit_code == 0
    [(stored,)] = query(pg_dsn, "SELECT payload FROM shardworker.jobs")
    assert stored == {"path": "C:\\u0000", "k\\u0000": 1}
    enqueue(pg_dsn, "k", {"text": "\\u0000"})
    for nul in ['{"a": "\\u0000"}', '{"\\u0000": 1}', r'{"a": "\\\u0000"}']:  # a real NUL, after a backslash too
        assert_one_line(invoke("enqueue", "k", nul, "--dsn", pg_dsn), "NUL")
    with pytest.raises(EnqueueError, match="NUL"):
        enqueue_many(pg_dsn, parse_jsonl(['{"kind": "k", "payload": "\\\\\\u0000"}']))
    assert job_count(pg_dsn) == 2


def test_a_naive_run_at_in_a_file_is_utc_as_since_reads_it(pg_dsn: str) -> None:
    execute(pg_dsn, "ALTER DATABASE " + query(pg_dsn, "SELECT current_database()")[0][0]
            + " SET timezone TO 'America/New_York'")
    result = invoke("enqueue", "--file", "-", "--dsn", pg_dsn, input='{"kind": "k", "run_at": "2030-01-01T12:00:00"}\n')
    assert result.exit_code == 0, result.output
    [(run_at,)] = query(pg_dsn, "SELECT run_at FROM shardworker.jobs")
    assert run_at == datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    enqueue(pg_dsn, "k", run_at=datetime(2030, 1, 2, 12, 0))
    assert query(pg_dsn, "SELECT max(run_at) FROM shardworker.jobs")[0][0] == datetime(2030, 1, 2, 12, tzinfo=UTC)
    listed = invoke("jobs", "list", "--since", "2020-01-01T00:00:00", "--json", "--dsn", pg_dsn)
    assert len(json.loads(listed.stdout)) == 2


@pytest.mark.parametrize("args", [
    ["jobs", "wait", "1", "--timeout", "1e300"],
    ["jobs", "wait", "1", "--timeout", "nan"],
    ["outbox", "drain", "--outbox-dir", "missing", "--timeout", "inf"],
])
def test_a_timeout_beyond_what_a_wait_can_hold_is_a_usage_error(pg_dsn: str, args: list[str]) -> None:
    result = invoke(*args, "--dsn", pg_dsn)
    assert_one_line(result, "--timeout", "seconds", codes=(2,))


@pytest.mark.parametrize("option, value", [
    ("--shutdown-timeout", "1e300"), ("--rescue-after", "nan"), ("--rescue-grace", "1e300"),
    ("--backoff-cap", "inf"), ("--statement-timeout", "99999999"), ("--network-timeout", "99999999"),
])
def test_a_worker_time_option_beyond_its_range_is_refused_before_the_worker_starts(
        pg_dsn: str, tmp_path: Path, option: str, value: str) -> None:
    done = console(b"run", b"--app", b"shardworker.demo.app", b"--exit-when-idle", b"--outbox-dir",
                   str(tmp_path / "outbox").encode(), option.encode(), value.encode(), b"--dsn", pg_dsn.encode())
    assert_console_one_line(done, option)
    assert done.returncode == 2
    assert not (tmp_path / "outbox").exists()


@pytest.mark.parametrize("payload", [{"x": float("nan")}, [1.5, float("inf")], {"a": [None, {"b": -float("inf")}]}])
def test_a_python_payload_with_nan_or_infinity_is_refused_not_stored_as_null(pg_dsn: str, payload: object) -> None:
    with pytest.raises(EnqueueError, match="not a finite number"):
        enqueue(pg_dsn, "k", payload)
    assert job_count(pg_dsn) == 0
    enqueue(pg_dsn, "k", {"a": None, "b": 1.5})  # null and finite floats are fine
    assert job_count(pg_dsn) == 1


@pytest.mark.parametrize("queues", ["", "a,,b", " , "])
def test_run_with_an_empty_queue_name_is_a_usage_error(queues: str) -> None:
    """An empty --queues (an unset $QUEUES in a script) must not mean every queue."""
    result = invoke("run", "--app", "counting_app", "--dsn", "postgresql://127.0.0.1:1/none", "--queues", queues)
    assert_one_line(result, "--queues", "empty", codes=(2,))


@pytest.mark.parametrize("after", ["1,,2", ",", "1,"])
def test_enqueue_after_with_an_empty_id_is_a_usage_error(after: str) -> None:
    result = invoke("enqueue", "k", "--after", after, "--dsn", "postgresql://127.0.0.1:1/none")
    assert_one_line(result, "--after", codes=(2,))


@pytest.mark.parametrize("dsn", ["mysql://u@h/db", "sqlite:///tmp/x.db", "http://127.0.0.1:5432/db"])
def test_a_dsn_of_another_database_says_so(dsn: str) -> None:
    """libpq's own line ('missing "=" ... in connection info string') does not say the scheme is wrong."""
    assert_one_line(invoke("stats", "--dsn", dsn), "not a PostgreSQL DSN", "postgresql://", codes=(2,))


@pytest.mark.parametrize("args", [
    ["jobs", "delete", str(2**63)],
    ["jobs", "show", "999999999999999999999"],
    ["jobs", "cancel", str(2**63)],
    ["enqueue", "k", "--after", str(2**63)],
])
def test_a_job_id_beyond_a_bigint_is_a_usage_error_not_the_databases(pg_dsn: str, args: list[str]) -> None:
    """Ids past PostgreSQL's bigint were sent, and refused there ("bigint out of range")."""
    result = invoke(*args, "--dsn", pg_dsn)
    assert result.exit_code == 2 and "out of range" not in result.output, result.output
    assert job_count(pg_dsn) == 0
