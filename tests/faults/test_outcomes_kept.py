"""No outcome is lost to the wrong database or to a corrupt segment: an outbox belongs to one
database and refuses others; an outcome whose job does not exist is set aside whole; the
jobs of a segment quarantined mid-run are settled at once. Real processes, real PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from click.testing import CliRunner

from outbox import ShardWriter
from outbox.segment import list_segments, parse, read_file, segment_name
from shardworker.cli.main import main as cli
from shardworker.core.model import Outcome
from shardworker.core.wire import encode_outcome
from shardworker.embedded import EmbeddedPostgres
from shardworker.store.migrate import apply_migrations
from tests.faults.test_faults import FAST
from tests.helpers import enqueue, exit_code, query, runs, start_worker, status_counts, wait_for, worker_log


def run_once_until_idle(dsn: str, outbox_dir: Path, counts: Path) -> None:
    proc = start_worker(dsn, outbox_dir, counts, "--exit-when-idle", procs=1)
    assert proc.wait(60) == 0, worker_log(counts)


def write_outcomes(outbox_dir: Path, outcomes: list[Outcome], shard: int = 7) -> None:
    with ShardWriter.open(str(outbox_dir), shard) as writer:
        for outcome in outcomes:
            writer.append_bytes(encode_outcome(outcome))
        writer.commit()


def other_database(pg_dsn: str) -> str:
    """A second migrated database on the same server."""
    import psycopg

    name = "other_" + os.urandom(4).hex()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = pg_dsn.rsplit("/", 1)[0] + "/" + name
    apply_migrations(dsn)
    return dsn


def test_drain_and_run_refuse_a_database_the_outbox_does_not_belong_to(
        pg_dsn: str, tmp_path: Path, monkeypatch: object) -> None:
    """An outbox used with one database refuses another, naming both; its outcomes stay pending; and
    a drain without --dsn does not start an embedded server for it."""
    outbox_dir, counts = tmp_path / "outbox", tmp_path / "counts"
    counts.mkdir()
    [job_id] = enqueue(pg_dsn, "count", 1)
    run_once_until_idle(pg_dsn, outbox_dir, counts)
    write_outcomes(outbox_dir, [Outcome.done(job_id, 2, b"1")])
    other = other_database(pg_dsn)
    result = CliRunner().invoke(cli, ["outbox", "drain", "--outbox-dir", str(outbox_dir), "--dsn", other])
    assert result.exit_code == 1
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("error: the outbox") and other.rsplit("/", 1)[1] in line and "belongs to" in line
    assert pg_dsn.rsplit("/", 1)[1] in line
    status = CliRunner().invoke(cli, ["outbox", "status", "--outbox-dir", str(outbox_dir), "--json"])
    assert json.loads(status.output)["pending"] == 1
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    os.chdir(workdir)
    result = CliRunner(env={"SHARDWORKER_DSN": None}).invoke(cli, ["outbox", "drain", "--outbox-dir",
                                                                   str(outbox_dir)])
    assert result.exit_code == 1 and "pass its --dsn" in result.output
    assert not (workdir / ".shardworker").exists(), "drain started an embedded server for a foreign outbox"
    proc = start_worker(other, outbox_dir, counts, "--exit-when-idle", procs=1)
    assert proc.wait(60) == 1
    assert "belongs to" in worker_log(counts).strip().splitlines()[-1]


def test_an_outcome_whose_job_does_not_exist_is_set_aside_whole(pg_dsn: str, tmp_path: Path) -> None:
    """Drain sets aside (never drops) an outcome for a job this database lacks, reports it, and exits 1."""
    outbox_dir, counts = tmp_path / "outbox", tmp_path / "counts"
    counts.mkdir()
    enqueue(pg_dsn, "count", 1)
    run_once_until_idle(pg_dsn, outbox_dir, counts)
    write_outcomes(outbox_dir, [Outcome.done(987654321, 1, b'{"precious": "result"}')])
    result = CliRunner().invoke(cli, ["outbox", "drain", "--outbox-dir", str(outbox_dir), "--dsn", pg_dsn])
    assert result.exit_code == 1 and "set aside" in result.output.strip().splitlines()[-1]
    [kept] = [json.loads(line) for line in (outbox_dir / "setaside.jsonl").read_text().splitlines()]
    assert (kept["job_id"], kept["attempt"], kept["result"]) == (987654321, 1, {"precious": "result"})
    status = CliRunner().invoke(cli, ["outbox", "status", "--outbox-dir", str(outbox_dir), "--json"])
    assert json.loads(status.output)["set_aside_outcomes"] == 1


def test_jobs_of_a_segment_quarantined_mid_run_are_settled_at_once(
        private_pg: EmbeddedPostgres, tmp_path: Path) -> None:
    """Corruption in a sealed segment found mid-run: its unreadable outcomes' jobs are requeued at once
    with the reason (they run again), the worker still exits when idle, and status counts them."""
    dsn, outbox_dir, counts = private_pg.dsn, tmp_path / "outbox", tmp_path / "counts"
    counts.mkdir()
    enqueue(dsn, "slow", 400, {"sleep": 0.002})
    proc = start_worker(dsn, outbox_dir, counts, *FAST, "--segment-bytes", "4096", "--exit-when-idle", procs=1)
    wait_for(lambda: status_counts(dsn).get("done", 0) >= 1, 30, "the worker working")
    private_pg.stop("immediate")
    wait_for(lambda: len(runs(counts)) == 400, 30, "every handler ran into the outbox")
    time.sleep(0.3)
    segs = list_segments(str(outbox_dir))[0]
    assert len(segs) >= 4, segs
    victim = outbox_dir / segment_name(0, segs[-3])  # sealed, unapplied, with outcomes after the damage
    frames = parse(read_file(str(victim)), 0, segs[-3]).data
    with open(victim, "r+b") as f:
        f.seek(frames[1].offset + 30)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    private_pg.start()
    assert exit_code(proc, 90, counts) == 0, worker_log(counts)
    assert status_counts(dsn) == {"done": 400}
    reran = {job for (job, attempt) in runs(counts) if attempt == 2}
    assert reran, "no job was requeued"
    errors = query(dsn, "SELECT DISTINCT last_error FROM shardworker.jobs WHERE attempt = 2")
    assert len(errors) == 1 and "quarantined" in errors[0][0]
    status = CliRunner().invoke(cli, ["outbox", "status", "--outbox-dir", str(outbox_dir), "--json"])
    doc = json.loads(status.output)
    assert doc["quarantined"] and doc["requeued_after_quarantine"] == len(reran)
    assert signal.SIGTERM  # the worker exited by itself: idle, nothing left running
