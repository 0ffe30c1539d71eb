"""``shardworker outbox`` through click's CliRunner on a real PostgreSQL: status, drain and
verify, on missing, pending, held and corrupt outbox directories."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from outbox import ShardWriter
from outbox.frame import HEADER_SIZE
from outbox.segment import list_segments, scan_file
from shardworker.core.layout import lock_outbox
from shardworker.core.model import ClaimedJob, Outcome
from shardworker.core.wire import encode_outcome
from shardworker.store.pg_store import PgStore
from tests.cli.cli_runner import assert_one_line_error, invoke, rows

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
    fd = lock_outbox(str(outbox_dir), "worker")
    try:
        status = json.loads(invoke("outbox", "status", "--json", "--outbox-dir", str(outbox_dir)).stdout)
        assert status["worker_running"] is True
        result = invoke("outbox", "drain", "--outbox-dir", str(outbox_dir), "--dsn", pg_dsn, "--timeout", "2")
        assert result.exit_code == 1, result.output
        assert result.stdout == ""
        errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and f"is in use by a worker (pid {os.getpid()})" in errors[0], result.stderr
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


def test_outbox_status_says_why_it_kept_an_outcome_of_a_cancelled_job(
        tmp_path: Path, pg_dsn: str, store: PgStore) -> None:
    """An outcome of a job an operator cancelled while it ran is kept in stale.jsonl, not
    applied; `outbox status` says it was cancelled, not that its attempt was rescued (as a new
    user saw it say), and tells it apart from a stale attempt's."""
    cancelled, stale = claim(store, pg_dsn, 2)
    invoke("jobs", "cancel", str(cancelled.id), "--dsn", pg_dsn)
    outbox_dir = tmp_path / "outbox"
    write_outcomes(outbox_dir, [Outcome.done(cancelled.id, cancelled.attempt, b"1"),
                                Outcome.done(stale.id, 99, b"2")])  # an attempt that never existed
    assert invoke("outbox", "drain", "--outbox-dir", str(outbox_dir), "--dsn", pg_dsn).exit_code == 0
    text = invoke("outbox", "status", "--outbox-dir", str(outbox_dir)).stdout
    assert "1 outcome(s) kept, not applied (their jobs were cancelled while they ran)" in text, text
    assert "1 stale outcome(s) kept, not applied (their attempts were rescued" in text, text
    counts = json.loads(invoke("outbox", "status", "--json", "--outbox-dir", str(outbox_dir)).stdout)
    assert (counts["stale_outcomes"], counts["cancelled_outcomes"]) == (2, 1)


def test_outbox_drain_applies_more_than_a_batch(tmp_path: Path, pg_dsn: str, store: PgStore) -> None:
    """12,000 outcomes, many batches (flush_batch 1,000): drain applies them all before it
    says it is done (it used to stop after a batch that ended on a due checkpoint)."""
    jobs = claim(store, pg_dsn, 12000)
    outbox_dir = tmp_path / "outbox"
    write_outcomes(outbox_dir, [Outcome.done(j.id, j.attempt, b"1") for j in jobs], shards=1)
    result = invoke("outbox", "drain", "--outbox-dir", str(outbox_dir), "--dsn", pg_dsn, "--timeout", "60")
    assert result.exit_code == 0, result.output
    assert "12000 applied" in result.stdout, result.stdout
    assert json.loads(invoke("outbox", "status", "--json", "--outbox-dir", str(outbox_dir)).stdout)["pending"] == 0
    assert {r["status"] for r in rows(pg_dsn)} == {"done"}


def test_outbox_drain_counts_step_results_apart_from_outcomes(tmp_path: Path, pg_dsn: str, store: PgStore) -> None:
    """The count led with every record, steps too, above a breakdown of outcomes that then did
    not add up ("drained 38 outcomes: 10 applied, ..."; found by a new user)."""
    from shardworker.core.model import StepRecord
    from shardworker.core.wire import encode_step

    jobs = claim(store, pg_dsn, 2)
    outbox_dir = tmp_path / "outbox"
    with ShardWriter.open(str(outbox_dir), 0) as writer:
        for job in jobs:
            for name in ("fetch", "parse", "store"):
                writer.append_bytes(encode_step(StepRecord(job.id, job.attempt, name, b'"r"', 1.0)))
            writer.append_bytes(encode_outcome(Outcome.done(job.id, job.attempt, b"1")))
        writer.commit()
    result = invoke("outbox", "drain", "--outbox-dir", str(outbox_dir), "--dsn", pg_dsn, "--timeout", "10")
    assert result.exit_code == 0, result.output
    assert ("drained 2 outcomes: 2 applied, 0 already applied, 0 stale, 0 set aside, 0 dead-lettered; "
            "and 6 step results") in result.stdout


def test_outbox_drain_counts_the_outcome_of_a_cancelled_job_as_an_outcome(
        tmp_path: Path, pg_dsn: str, store: PgStore) -> None:
    """An outcome kept because its job was cancelled while it ran is an outcome, not a step
    result (a review point on the count above)."""
    from shardworker import jobs as jobs_api

    [job] = claim(store, pg_dsn, 1)
    assert jobs_api.cancel(pg_dsn, [job.id]) == 1
    outbox_dir = tmp_path / "outbox"
    write_outcomes(outbox_dir, [Outcome.done(job.id, job.attempt, b"1")], shards=1)
    result = invoke("outbox", "drain", "--outbox-dir", str(outbox_dir), "--dsn", pg_dsn, "--timeout", "10")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("drained 1 outcomes: 0 applied") and "1 kept (their jobs were cancelled)" in \
        result.stdout and "step results" not in result.stdout, result.stdout
