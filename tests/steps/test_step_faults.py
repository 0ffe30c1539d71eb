"""The promise for steps under real faults: a step that returned never runs again for its job,
not after kill -9 of a child or of the whole worker (restarted with the database up or still
down), a database outage, a manual `outbox drain` and a restart with another --procs, nor a
rescue onto another host once its record reached PostgreSQL. Each counts the step runs inside
the step function (tests/apps/steps_app.py) and checks every job's row."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardworker.embedded import EmbeddedPostgres
from tests.helpers import (
    enqueue,
    exit_code,
    kill_worker_group,
    query,
    start_worker,
    wait_for,
    worker_env,
)
from tests.steps.step_ledger import assert_steps_once, ledger, step_runs

FAST = ("--backoff-cap", "1", "--network-timeout", "3")


def ledger_shows(count_dir: Path, ids: list[int], name: str) -> bool:
    """Step ``name`` of every job started."""
    ran = step_runs(count_dir)
    return all(ran[(job_id, name)] >= 1 for job_id in ids)


def ledger_returned(count_dir: Path, ids: list[int], name: str) -> bool:
    """Step ``name`` of every job returned: its record is durable, so no kill from now on may
    run it again (a step merely started may run again: a kill can cut it short)."""
    returned = {(job_id, step) for _, job_id, step, event in ledger(count_dir) if event == "returned"}
    return all((job_id, name) in returned for job_id in ids)


def steps_landed(dsn: str, ids: list[int], name: str) -> bool:
    return query(dsn, "SELECT count(*) FROM shardworker.job_steps WHERE name = %s AND job_id = ANY(%s)",
                 name, ids)[0][0] == len(ids)




@pytest.mark.parametrize("kind", ["extract", "agent"])
def test_a_child_killed_after_a_step_leaves_it_done(pg_dsn: str, dirs: tuple[Path, Path], kind: str) -> None:
    """The child dies (SIGKILL) right after the second step: the job is charged an attempt and
    the next one replays both steps. (``async def`` jobs run side by side: a death may cut a
    neighbour's step short before its record was durable, and that one runs again.)"""
    outbox_dir, count_dir = dirs
    ids = enqueue(pg_dsn, kind, 4, {"die_after": "ocr"})
    proc = start_worker(pg_dsn, outbox_dir, count_dir, *FAST, "--exit-when-idle", app="steps_app")
    assert exit_code(proc, 90, count_dir) == 0
    assert_steps_once(pg_dsn, count_dir, ids, exactly=kind != "agent")


def test_a_child_killed_in_an_outage_carries_its_steps_ahead_of_its_failure(
        private_pg: EmbeddedPostgres, dirs: tuple[Path, Path]) -> None:
    """A child dies after two steps while PostgreSQL is down: the parent writes the job's
    failure to its own shard after copies of those steps' records, so wherever the flusher
    starts, the steps land no later than the retry they must precede."""
    dsn, (outbox_dir, count_dir) = private_pg.dsn, dirs
    ids = enqueue(dsn, "extract", 2, {"sleep": 0.8, "die_after": "ocr"})
    proc = start_worker(dsn, outbox_dir, count_dir, *FAST, "--exit-when-idle", app="steps_app", procs=2)
    wait_for(lambda: ledger_shows(count_dir, ids, "fetch"), 30, "the first steps under way")
    private_pg.stop("immediate")
    # The deaths are logged before the parent's next pass writes what they leave to its shard.
    wait_for(lambda: {job_id for kind, job_id, _ in _parent_shard(outbox_dir) if kind == "outcome"} >= set(ids),
             30, "the failures of the children that died after their second step")
    records = _parent_shard(outbox_dir)
    for job_id in ids:
        failure = records.index(("outcome", job_id, ""))
        assert {name for kind, j, name in records[:failure] if kind == "step" and j == job_id} == {"fetch", "ocr"}, \
            records
    private_pg.start()
    assert exit_code(proc, 90, count_dir) == 0
    assert_steps_once(dsn, count_dir, ids)


def _parent_shard(outbox_dir: Path) -> list[tuple[str, int, str]]:
    """The parent's shard in order: ("step", job id, step name) and ("outcome", job id, "")."""
    from outbox.segment import list_segments, parse, read_file, segment_name
    from shardworker.core.layout import PARENT_SHARD
    from shardworker.core.model import StepRecord
    from shardworker.core.wire import decode_record

    found: list[tuple[str, int, str]] = []
    for segno in list_segments(str(outbox_dir)).get(PARENT_SHARD, []):
        buf = read_file(str(outbox_dir / segment_name(PARENT_SHARD, segno)))
        for frame in parse(buf, PARENT_SHARD, segno).data:
            record = decode_record(frame.payload)
            found.append(("step", record.job_id, record.name) if isinstance(record, StepRecord)
                         else ("outcome", record.job_id, ""))
    return found


@pytest.mark.parametrize("database", ["up", "down"])
def test_a_worker_killed_between_steps_and_restarted_runs_no_step_again(
        private_pg: EmbeddedPostgres, dirs: tuple[Path, Path], database: str) -> None:
    """kill -9 of the whole worker while every job waits after its second step; restarted with
    the database up, or still down (it comes back later): the steps recorded in the outbox land
    before the jobs are claimed again, and the new attempts replay them."""
    dsn, (outbox_dir, count_dir) = private_pg.dsn, dirs
    ids = enqueue(dsn, "extract_threads", 6, {"wait_after": "ocr"})
    proc = start_worker(dsn, outbox_dir, count_dir, *FAST, app="steps_app", procs=2)
    wait_for(lambda: ledger_returned(count_dir, ids, "ocr"), 30, "every job past its second step")
    if database == "down":
        private_pg.stop("immediate")
    kill_worker_group(proc)
    proc = start_worker(dsn, outbox_dir, count_dir, *FAST, "--exit-when-idle", app="steps_app", procs=2)
    if database == "down":
        time.sleep(2.0)
        assert proc.poll() is None
        private_pg.start()
    assert exit_code(proc, 90, count_dir) == 0
    assert_steps_once(dsn, count_dir, ids)


def test_steps_across_an_outage_run_once(private_pg: EmbeddedPostgres, dirs: tuple[Path, Path]) -> None:
    """PostgreSQL stopped while jobs are in the middle of their steps, started again later."""
    dsn, (outbox_dir, count_dir) = private_pg.dsn, dirs
    ids = enqueue(dsn, "agent", 30, {"sleep": 0.2})
    proc = start_worker(dsn, outbox_dir, count_dir, *FAST, "--exit-when-idle", "--concurrency", "10",
                        app="steps_app", procs=2)
    wait_for(lambda: len(step_runs(count_dir)) >= 10, 30, "steps under way")
    private_pg.stop("immediate")
    time.sleep(2.0)
    private_pg.start()
    assert exit_code(proc, 90, count_dir) == 0
    assert_steps_once(dsn, count_dir, ids)


def test_a_manual_drain_then_another_procs_runs_no_step_again(
        private_pg: EmbeddedPostgres, dirs: tuple[Path, Path]) -> None:
    """Killed in an outage between steps; `shardworker outbox drain` once the database is back;
    then a worker with another --procs finishes the jobs, replaying their steps."""
    dsn, (outbox_dir, count_dir) = private_pg.dsn, dirs
    ids = enqueue(dsn, "extract_threads", 6, {"wait_after": "ocr"})
    proc = start_worker(dsn, outbox_dir, count_dir, *FAST, app="steps_app", procs=2)
    wait_for(lambda: ledger_returned(count_dir, ids, "ocr"), 30, "every job past its second step")
    private_pg.stop("immediate")
    kill_worker_group(proc)
    private_pg.start()
    drained = subprocess.run([sys.executable, "-m", "shardworker", "outbox", "drain", "--outbox-dir", str(outbox_dir),
                              "--dsn", dsn, "--timeout", "30"], env=worker_env(count_dir), capture_output=True,
                             text=True, timeout=60)
    assert drained.returncode == 0, drained.stderr
    assert steps_landed(dsn, ids, "ocr")
    proc = start_worker(dsn, outbox_dir, count_dir, *FAST, "--exit-when-idle", app="steps_app", procs=3)
    assert exit_code(proc, 90, count_dir) == 0
    assert_steps_once(dsn, count_dir, ids)


def test_a_rescue_onto_another_host_replays_the_steps_that_reached_postgresql(
        pg_dsn: str, tmp_path: Path) -> None:
    """Host A dies for good between steps once their records reached PostgreSQL; host B rescues
    the jobs and runs only the steps A never ran."""
    counts = tmp_path / "counts"
    counts.mkdir()
    ids = enqueue(pg_dsn, "extract_threads", 4, {"wait_after": "ocr"})
    a = start_worker(pg_dsn, tmp_path / "a", counts, *FAST, "--worker-id", "host-a", "--rescue-after", "5",
                     "--shutdown-timeout", "2", app="steps_app", procs=1)
    wait_for(lambda: steps_landed(pg_dsn, ids, "ocr"), 30, "A's steps in PostgreSQL")
    b = start_worker(pg_dsn, tmp_path / "b", counts, *FAST, "--worker-id", "host-b", "--rescue-after", "5",
                     "--shutdown-timeout", "2", "--rescue-grace", "0", app="steps_app", procs=1)
    kill_worker_group(a)
    wait_for(lambda: query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE status = 'done'")[0][0] == len(ids),
             60, "B finishing A's rescued jobs")
    b.send_signal(signal.SIGTERM)
    assert b.wait(30) == 0
    assert_steps_once(pg_dsn, counts, ids)
    assert query(pg_dsn, "SELECT min(attempt) FROM shardworker.jobs WHERE id = ANY(%s)", ids)[0][0] == 2
