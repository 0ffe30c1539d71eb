"""A handler that kills its own process after it returned (a leftover thread or timer) does
not get the innocent job that runs next charged for the death (issue 41, 14): one running
job is charged for its process's death only when no other handler ran in that process, or
when it ran alone as a suspect."""

from __future__ import annotations

import signal
from pathlib import Path

from shardworker.embedded import EmbeddedPostgres
from tests.helpers import enqueue, exit_code, query, runs, start_worker, wait_for, worker_log


def test_a_leftover_timer_of_a_finished_job_gets_no_neighbour_charged(private_pg: EmbeddedPostgres,
                                                                    tmp_path: Path) -> None:
    dsn, counts = private_pg.dsn, tmp_path / "counts"
    counts.mkdir()
    (careless,) = enqueue(dsn, "careless", 1)
    (innocent,) = enqueue(dsn, "neighbour", 1)
    proc = start_worker(dsn, tmp_path / "outbox", counts, procs=1, app="leftover_app")
    try:
        wait_for(lambda: query(dsn, "SELECT count(*) FROM shardworker.jobs WHERE status IN ('done', 'failed')")
                 == [(2,)], 60, "both jobs to end")
    finally:
        proc.send_signal(signal.SIGTERM)
    assert exit_code(proc, 30, counts) == 0, worker_log(counts)[-3000:]
    rows = dict(query(dsn, "SELECT id, status FROM shardworker.jobs"))
    assert rows == {careless: "done", innocent: "done"}, worker_log(counts)[-3000:]
    assert runs(counts)[(careless, 1)] == 1
