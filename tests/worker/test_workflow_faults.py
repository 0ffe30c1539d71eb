"""Workflows through real faults (issue 24, point 1): 20 documents, each a ``split`` job that
enqueues 50 ``part`` follow-ups and one ``merge`` after all of them (tests/apps/workflow_app.py),
run by real ``shardworker run`` processes on a real PostgreSQL that is stopped mid-run, with
the workers restarted while it is down. At the end: exactly 1,040 rows, all done, every handler
run once, every merge started after all of its parts finished and saw their 50 results.

The outage is timed to catch a split in its handler: its outcome, carrying its 51 follow-ups,
waits in the outbox through the restart and lands after the database is back.
"""

from __future__ import annotations

import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from shardworker.client import JobSpec, enqueue_many
from shardworker.embedded import EmbeddedPostgres
from tests.helpers import exit_code, kill_worker_group, query, start_worker, wait_for, worker_log
from tests.worker.workflow_ledger import assert_workflows_once, ledger, open_runs

DOCS, PARTS = 20, 50
FAST = ("--backoff-cap", "1", "--network-timeout", "3")
APP = "workflow_app"


@pytest.fixture(autouse=True)
def _sleeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """A split reads its document for 0.3 s, a part for 10 ms: work stays in hand at the outage."""
    monkeypatch.setenv("SW_WORKFLOW_SPLIT_SLEEP", "0.3")
    monkeypatch.setenv("SW_WORKFLOW_PART_SLEEP", "0.01")


def enqueue_documents(dsn: str) -> None:
    """The 20 splits, arriving over 6 s (split i due at 0.3 s x i), so splits run all along,
    even on a loaded machine where parts and merges fall behind."""
    now = datetime.now(UTC)
    enqueue_many(dsn, [JobSpec("split", {"doc": f"doc{i}", "parts": PARTS}, run_at=now + timedelta(seconds=0.3 * i))
                       for i in range(DOCS)])


def stop_during_a_split(server: EmbeddedPostgres, count_dirs: list[Path]) -> int:
    """Once a merge has started, stop PostgreSQL (immediate) while a split's handler is running;
    wait until that split has ended (its outcome and follow-ups in the outbox). Its id."""
    running: list[int] = []  # the splits seen running when the wait ended (one may end right after)

    def split_running() -> bool:
        merges = sum(1 for e in ledger(count_dirs) if e.kind == "merge" and e.event == "start")
        running[:] = open_runs(count_dirs, "split") if merges >= 1 else []
        return bool(running)

    wait_for(split_running, 40, "a split running after a merge started", step_s=0.01)
    split_id = running[0]
    server.stop("immediate")
    wait_for(lambda: split_id not in open_runs(count_dirs, "split"), 10, f"split {split_id} to end in the outage")
    return split_id


def quiet(count_dir: Path, for_s: float) -> bool:
    """Whether no handler of the worker counting into ``count_dir`` has started or ended for ``for_s``."""
    entries = ledger([count_dir])
    return not entries or time.time() - entries[-1].at >= for_s


def applied_after(dsn: str, job_id: int, at: float) -> bool:
    (finished,) = query(dsn, "SELECT extract(epoch FROM finished_at) FROM shardworker.jobs WHERE id = %s", job_id)[0]
    return float(finished) > at




def test_an_outage_and_a_restart_during_it_run_every_workflow_job_once(
        private_pg: EmbeddedPostgres, dirs: tuple[Path, Path]) -> None:
    """One worker (--procs 2), stopped with SIGTERM during the outage while its handlers run
    (they finish into the outbox; the jobs it had not started are kept in giveback.json), and
    started again while PostgreSQL is still down."""
    dsn, (outbox_dir, count_dir) = private_pg.dsn, dirs
    enqueue_documents(dsn)
    proc = start_worker(dsn, outbox_dir, count_dir, *FAST, app=APP, procs=2)
    split_id = stop_during_a_split(private_pg, [count_dir])
    proc.send_signal(signal.SIGTERM)
    assert exit_code(proc, 30, count_dir) == 0
    assert "outcomes remain in the outbox" in worker_log(count_dir)
    proc = start_worker(dsn, outbox_dir, count_dir, *FAST, "--exit-when-idle", app=APP, procs=2)
    time.sleep(2.0)
    assert proc.poll() is None, worker_log(count_dir)
    back_at = time.time()
    private_pg.start()
    assert exit_code(proc, 60, count_dir) == 0
    assert_workflows_once(dsn, [count_dir], DOCS, PARTS)
    assert applied_after(dsn, split_id, back_at), "the split caught by the outage was applied before it"


def test_two_workers_through_an_outage_and_restarts_run_every_workflow_job_once(
        private_pg: EmbeddedPostgres, tmp_path: Path) -> None:
    """Two workers on one database (own outbox directories, --worker-id a and b, --procs 2
    each). During the outage a is stopped with SIGTERM while its handlers run, and b with
    kill -9 once it has finished what it held (a kill -9 of a busy worker may run the jobs in
    its hands again: at-least-once for unfinished work); both start again before PostgreSQL
    is back."""
    dsn = private_pg.dsn
    counts = {name: tmp_path / f"counts-{name}" for name in "ab"}
    for path in counts.values():
        path.mkdir()
    enqueue_documents(dsn)

    def start(name: str, *extra: str) -> subprocess.Popen[bytes]:
        return start_worker(dsn, tmp_path / f"outbox-{name}", counts[name], *FAST, "--worker-id", f"host-{name}",
                            *extra, app=APP, procs=2)

    a, b = start("a"), start("b")
    split_id = stop_during_a_split(private_pg, list(counts.values()))
    a.send_signal(signal.SIGTERM)
    wait_for(lambda: quiet(counts["b"], 1.0), 30, "b idle in the outage")
    kill_worker_group(b)
    assert exit_code(a, 30, counts["a"]) == 0
    a, b = start("a", "--exit-when-idle"), start("b", "--exit-when-idle")
    time.sleep(2.0)
    assert a.poll() is None and b.poll() is None, worker_log(counts["a"]) + worker_log(counts["b"])
    back_at = time.time()
    private_pg.start()
    assert exit_code(a, 60, counts["a"]) == 0
    assert exit_code(b, 60, counts["b"]) == 0
    assert_workflows_once(dsn, list(counts.values()), DOCS, PARTS)
    assert applied_after(dsn, split_id, back_at), "the split caught by the outage was applied before it"
