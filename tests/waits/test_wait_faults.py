"""Durable waits under real faults: a sleep is never slept again, and no step before or after it
runs twice, across a SIGTERM and a database outage during the sleep, a kill -9 of the whole
worker, and a restart on another worker process. Runs and steps are counted inside the
handlers (``tests/apps/waits_app.py``); every job's final row is checked."""

from __future__ import annotations

import time
from pathlib import Path

import orjson

from shardworker.embedded import EmbeddedPostgres
from tests.helpers import enqueue, exit_code, kill_worker_group, query, runs_per_job, start_worker, wait_for
from tests.steps.step_ledger import ledger, reruns_after_return, step_runs

FAST = ("--backoff-cap", "1", "--network-timeout", "3")


def returned(count_dir: Path, ids: list[int], name: str) -> bool:
    done = {(job_id, step) for _, job_id, step, event in ledger(count_dir) if event == "returned"}
    return all((job_id, name) in done for job_id in ids)


def woke_at(count_dir: Path) -> dict[int, list[float]]:
    """When each job's run came past its sleep (the handler's own note), in order."""
    woke: dict[int, list[float]] = {}
    for path in count_dir.glob("woke-*.log"):
        for line in path.read_text().splitlines():
            job_id, at = line.split()
            woke.setdefault(int(job_id), []).append(float(at))
    return woke


def _waits_logged(count_dir: Path, ids: list[int]) -> bool:
    log = (count_dir / "worker.log").read_text()
    return all(f"job {i} (nap) attempt 1 waits" in log for i in ids)


def assert_slept_once(dsn: str, count_dir: Path, ids: list[int], sleep_s: float, slept_from: float) -> None:
    """Every job done with both steps' results, each step run once (none after it had returned),
    two handler runs (up to the sleep, then after it), the sleep passed once and not before its time."""
    rows = {i: (s, r) for i, s, r in query(dsn, "SELECT id, status, result FROM shardworker.jobs WHERE id = ANY(%s)",
                                           ids)}
    assert rows == {i: ("done", {"before": f"before-{i}", "after": f"after-{i}"}) for i in ids}
    ran = step_runs(count_dir)
    assert {i: (ran[(i, "before")], ran[(i, "after")]) for i in ids} == {i: (1, 1) for i in ids}
    assert not reruns_after_return(count_dir)
    assert {i: runs_per_job(count_dir)[i] for i in ids} == {i: 2 for i in ids}
    woke = woke_at(count_dir)
    assert {i: len(woke.get(i, ())) for i in ids} == {i: 1 for i in ids}
    assert min(woke[i][0] for i in ids) >= slept_from + sleep_s - 0.5  # the child's clock and ours: one host
    recorded = query(dsn, "SELECT job_id, result FROM shardworker.job_steps WHERE name = 'nap' AND job_id = ANY(%s)",
                     ids)
    assert len(recorded) == len(ids) and all("slept_until" in r for _, r in recorded)


def test_a_sleep_survives_a_sigterm_and_an_outage_during_it(private_pg: EmbeddedPostgres,
                                                             dirs: tuple[Path, Path]) -> None:
    """Two jobs step (1 s), then sleep 5 s. PostgreSQL stops while their steps run, so the
    steps' records and the suspended outcomes wait in the outbox; the worker gets SIGTERM during
    the outage, once they are durable there; PostgreSQL comes back and a new worker starts: the
    outcomes land, the sleeps end on time, and every job goes on after its sleep exactly once."""
    dsn, (outbox_dir, count_dir) = private_pg.dsn, dirs
    ids = enqueue(dsn, "nap", 2, {"sleep": 5, "step_s": 1.0})
    slept_from = time.time()
    proc = start_worker(dsn, outbox_dir, count_dir, *FAST, procs=2, app="waits_app")
    wait_for(lambda: all(step_runs(count_dir)[(i, "before")] for i in ids), 30, "every job in its first step")
    private_pg.stop("immediate")
    wait_for(lambda: returned(count_dir, ids, "before"), 30, "every job at its sleep")
    wait_for(lambda: _waits_logged(count_dir, ids), 30, "both jobs suspended, their outcomes in the outbox")
    proc.terminate()
    assert exit_code(proc, 60, count_dir) == 0
    time.sleep(1.0)
    private_pg.start()
    proc = start_worker(dsn, outbox_dir, count_dir, *FAST, "--exit-when-idle", procs=2, app="waits_app")
    assert exit_code(proc, 90, count_dir) == 0
    assert_slept_once(dsn, count_dir, ids, 5, slept_from)


def test_a_worker_killed_while_its_jobs_sleep_leaves_them_sleeping(private_pg: EmbeddedPostgres,
                                                                   dirs: tuple[Path, Path]) -> None:
    """kill -9 of the whole worker once its jobs sleep in PostgreSQL: nothing of theirs is lost
    or run again; another worker (a new outbox, as on another host) runs them on after the sleep."""
    dsn, (outbox_dir, count_dir) = private_pg.dsn, dirs
    ids = enqueue(dsn, "nap", 4, {"sleep": 4})
    slept_from = time.time()
    proc = start_worker(dsn, outbox_dir, count_dir, *FAST, procs=2, app="waits_app")
    wait_for(lambda: query(dsn, "SELECT count(*) FROM shardworker.jobs WHERE status = 'waiting'")[0][0] == 4, 30,
             "every job asleep")
    kill_worker_group(proc)
    other = outbox_dir.parent / "other-outbox"
    proc = start_worker(dsn, other, count_dir, *FAST, "--exit-when-idle", procs=1, app="waits_app")
    assert exit_code(proc, 90, count_dir) == 0
    assert_slept_once(dsn, count_dir, ids, 4, slept_from)


def test_a_wait_for_an_event_survives_an_outage_when_it_is_sent(private_pg: EmbeddedPostgres,
                                                                 dirs: tuple[Path, Path]) -> None:
    """The event comes while the waiting jobs' worker cannot reach PostgreSQL (sent by another
    process, on the database's side of the cut): once it is back the jobs run on with it, once."""
    dsn, (outbox_dir, count_dir) = private_pg.dsn, dirs
    ids = enqueue(dsn, "approval", 3, {"order": 11})
    proc = start_worker(dsn, outbox_dir, count_dir, *FAST, procs=2, app="waits_app")
    wait_for(lambda: query(dsn, "SELECT count(*) FROM shardworker.jobs WHERE wait_kind = 'event'")[0][0] == 3, 30,
             "every job waiting for its approval")
    private_pg.stop("immediate")
    time.sleep(1.5)
    private_pg.start()
    import shardworker
    assert shardworker.send_event(dsn, "approve:11", {"ok": True}) == 3
    wait_for(lambda: query(dsn, "SELECT count(*) FROM shardworker.jobs WHERE status = 'done'")[0][0] == 3, 60,
             "the approved jobs to finish")
    proc.terminate()
    assert exit_code(proc, 60, count_dir) == 0
    results = [orjson.dumps(r) for (r,) in query(dsn, "SELECT result FROM shardworker.jobs ORDER BY id")]
    assert results == [b'{"decision":{"ok":true}}'] * 3
    ran = step_runs(count_dir)
    assert all(ran[(i, "draft")] == 1 and ran[(i, "ship")] == 1 for i in ids)
    assert all(runs_per_job(count_dir)[i] == 2 for i in ids)


def test_progress_reported_during_an_outage_lands_when_the_database_returns(private_pg: EmbeddedPostgres,
                                                                          dirs: tuple[Path, Path]) -> None:
    """A job reports its progress and ends while PostgreSQL is stopped: its progress records wait
    in the outbox with its outcome, and both land once the database is back."""
    dsn, (outbox_dir, count_dir) = private_pg.dsn, dirs
    (job_id,) = enqueue(dsn, "reporter", 1, {"steps": 8, "every": 0.25})
    proc = start_worker(dsn, outbox_dir, count_dir, *FAST, "--exit-when-idle", procs=1, app="waits_app")
    wait_for(lambda: runs_per_job(count_dir)[job_id] == 1, 30, "the reporter started")
    private_pg.stop("immediate")
    time.sleep(2.5)  # it reports and ends meanwhile
    private_pg.start()
    assert exit_code(proc, 60, count_dir) == 0
    assert query(dsn, "SELECT status, progress, result FROM shardworker.jobs WHERE id = %s", job_id) == [
        ("done", {"done": 8, "of": 8}, 8)]
    assert runs_per_job(count_dir)[job_id] == 1
