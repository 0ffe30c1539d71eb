"""A rolled-back deploy: an outbox holding a record that a newer shardworker wrote (a record
version this one does not know) is refused, not dead-lettered. Dead-lettering it would leave
its job running under the worker's id, and the start's recovery would then requeue it: a
handler that finished under the newer version would run again. Real worker through the
console's module, real `outbox drain`."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from outbox import ShardWriter
from shardworker.cli.main import main as cli
from shardworker.core import layout
from shardworker.core.config import StoreConfig
from shardworker.core.model import Outcome
from shardworker.core.records import NEWEST_VERSION
from shardworker.core.wire import encode_outcome
from shardworker.store.pg_store import PgStore
from tests.helpers import enqueue, query, runs, start_worker, worker_log

NEWER_WORKER = "host-b-newer"


def newer_record(job_id: int, attempt: int) -> bytes:
    """A CRC-valid record whose version byte is one this release has never written."""
    record = bytearray(encode_outcome(Outcome.done(job_id, attempt, b'{"from": "a newer release"}')))
    record[0] = NEWEST_VERSION + 1
    return bytes(record)


def outbox_of_a_newer_worker(pg_dsn: str, outbox_dir: Path) -> list[int]:
    """Three jobs claimed by a worker of a newer release, killed with their outcomes on disk:
    the first and last in today's format, the middle one in a newer one."""
    ids = enqueue(pg_dsn, "count", 3)
    store = PgStore(StoreConfig(dsn=pg_dsn))
    try:
        jobs = store.claim(["count"], None, NEWER_WORKER, 3)
    finally:
        store.close()
    assert sorted(j.id for j in jobs) == ids
    with ShardWriter.open(str(outbox_dir), 0) as writer:
        writer.append_bytes(encode_outcome(Outcome.done(jobs[0].id, jobs[0].attempt, b"1")))
        writer.append_bytes(newer_record(jobs[1].id, jobs[1].attempt))
        writer.append_bytes(encode_outcome(Outcome.done(jobs[2].id, jobs[2].attempt, b"3")))
        writer.commit()
    assert layout.resolve_worker_id(str(outbox_dir), NEWER_WORKER) == NEWER_WORKER
    return [j.id for j in jobs]


def test_run_and_drain_refuse_an_outbox_holding_a_newer_release_s_record(
        pg_dsn: str, tmp_path: Path) -> None:
    outbox_dir, counts = tmp_path / "outbox", tmp_path / "counts"
    counts.mkdir()
    ids = outbox_of_a_newer_worker(pg_dsn, outbox_dir)

    proc = start_worker(pg_dsn, outbox_dir, counts, "--exit-when-idle", procs=1)
    assert proc.wait(60) == 1, worker_log(counts)
    last = worker_log(counts).strip().splitlines()[-1]
    assert last.startswith("error: ") and "newer shardworker" in last and f"record version {NEWEST_VERSION + 1}" in last, last
    assert "Traceback" not in worker_log(counts)
    held = query(pg_dsn, "SELECT status, attempt, locked_by FROM shardworker.jobs WHERE id = %s", ids[1])
    assert held == [("running", 1, NEWER_WORKER)], "the job of the newer record was requeued"
    assert not runs(counts), "a job whose outcome waits in the outbox ran again"
    assert not (outbox_dir / layout.DEADLETTER_DIR).exists() or not any((outbox_dir / layout.DEADLETTER_DIR).iterdir())

    drain = CliRunner().invoke(cli, ["outbox", "drain", "--outbox-dir", str(outbox_dir), "--dsn", pg_dsn,
                                     "--timeout", "20"])
    assert drain.exit_code == 1, drain.output
    errors = [line for line in drain.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "newer shardworker" in errors[0], drain.output
    assert query(pg_dsn, "SELECT status FROM shardworker.jobs WHERE id = %s", ids[1]) == [("running",)]
    status = json.loads(CliRunner().invoke(cli, ["outbox", "status", "--json", "--outbox-dir",
                                                 str(outbox_dir)]).stdout)
    assert status["pending"] >= 1, "the newer record is still on disk, for the newer release to apply"
