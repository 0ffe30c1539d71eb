"""Flow control through real worker processes on a real PostgreSQL (tests/apps/flow_app.py):
a capped slow kind never holds up another queue's fast jobs; global_concurrency and rate
hold across two workers, counted by the handlers' own ledger; a paused queue is not
claimed; a killed worker's limit slots come back through the rescue."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

from tests.helpers import enqueue, execute, exit_code, kill_worker_group, query, start_worker, wait_for

Run = tuple[str, int, int, float, float]  # kind, id, attempt, start, end


def ledger(count_dir: Path) -> list[Run]:
    runs: list[Run] = []
    for path in count_dir.glob("ledger-*.log"):
        for line in path.read_text().splitlines():
            kind, job_id, attempt, start, end = line.split()
            runs.append((kind, int(job_id), int(attempt), float(start), float(end)))
    return runs


def most_at_once(runs: list[Run]) -> int:
    events = sorted([(r[3], 1) for r in runs] + [(r[4], -1) for r in runs], key=lambda e: (e[0], e[1]))
    at_once = most = 0
    for _, step in events:
        at_once += step
        most = max(most, at_once)
    return most


def most_starts_in_a_second(runs: list[Run]) -> int:
    starts = sorted(r[3] for r in runs)
    most, first = 0, 0
    for last, at in enumerate(starts):
        while at - starts[first] >= 1.0:
            first += 1
        most = max(most, last - first + 1)
    return most


def flow_worker(dsn: str, tmp: Path, name: str, *args: str, procs: int = 2):  # type: ignore[no-untyped-def]
    count_dir = tmp / "counts"
    count_dir.mkdir(exist_ok=True)
    return start_worker(dsn, tmp / f"outbox-{name}", count_dir, "--worker-id", name, *args, procs=procs,
                        app="flow_app", log_path=count_dir / f"{name}.log")


def latencies(dsn: str, kind: str) -> list[float]:
    rows = query(dsn, "SELECT extract(epoch FROM finished_at - created_at)::float8 FROM shardworker.jobs "
                      "WHERE kind = %s AND status = 'done' ORDER BY 1", kind)
    return [r[0] for r in rows]


def test_fast_jobs_of_another_queue_never_wait_behind_a_capped_slow_kind(pg_dsn: str, tmp_path: Path) -> None:
    """300 half-second API calls capped at 20 (7.5 s of them at least), then 300 one-millisecond
    jobs of another queue: every fast job has finished while most of the capped backlog has
    yet to start (they used to wait for it to be claimed first), and never more than 20 calls
    ran at once. Told by the order of the runs, not by a clock, so a busy machine cannot fail it
    (bench/fairness.py measures the latency)."""
    enqueue(pg_dsn, "api", 300, {"sleep": 0.5})
    worker = flow_worker(pg_dsn, tmp_path, "w1", "--concurrency", "20", "--exit-when-idle")
    wait_for(lambda: query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE kind = 'api' "
                                   "AND status = 'done'")[0][0] >= 20, 60, "the first API calls to finish")
    enqueue(pg_dsn, "thumb", 300, queue="uploads")
    assert exit_code(worker, 120, tmp_path / "counts") == 0
    assert len(latencies(pg_dsn, "thumb")) == 300
    runs = ledger(tmp_path / "counts")
    last_fast_end = max(r[4] for r in runs if r[0] == "thumb")
    calls_after = sum(1 for r in runs if r[0] == "api" and r[3] > last_fast_end)
    assert calls_after >= 100, f"only {calls_after} of 300 capped calls started after the last fast job ended"
    assert most_at_once([r for r in runs if r[0] == "api"]) <= 20
    assert len(runs) == 600 and len({(r[1], r[2]) for r in runs}) == 600


def test_global_concurrency_holds_across_two_workers(pg_dsn: str, tmp_path: Path) -> None:
    """Two workers of two children each, a kind with global_concurrency=5: never more than 5
    handlers at once across both (the handlers' own start and end times), every job once."""
    ids = enqueue(pg_dsn, "limited", 60, {"sleep": 0.2})
    workers = [flow_worker(pg_dsn, tmp_path, name, "--concurrency", "10", "--exit-when-idle")
               for name in ("w1", "w2")]
    for worker in workers:
        assert exit_code(worker, 120, tmp_path / "counts") == 0
    runs = ledger(tmp_path / "counts")
    assert sorted(r[1] for r in runs) == ids
    assert most_at_once(runs) <= 5
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE status = 'done'") == [(60,)]


def test_a_rate_holds_across_two_workers(pg_dsn: str, tmp_path: Path) -> None:
    """rate="50/s" over 1,000 jobs and two workers: never more than 55 starts in any
    one-second window, and about 20 s in all."""
    enqueue(pg_dsn, "paced", 1000)
    # One child each: the limit is the database's, across workers; fewer processes starting at
    # once on a busy machine (the suite runs three test processes) delay the first starts less.
    workers = [flow_worker(pg_dsn, tmp_path, name, "--exit-when-idle", procs=1) for name in ("w1", "w2")]
    for worker in workers:
        assert exit_code(worker, 180, tmp_path / "counts") == 0
    runs = ledger(tmp_path / "counts")
    assert len(runs) == 1000 and len({r[1] for r in runs}) == 1000
    assert most_starts_in_a_second(runs) <= 55
    span = max(r[3] for r in runs) - min(r[3] for r in runs)
    assert 18 <= span <= 40, f"1,000 starts at 50/s took {span:.1f}s"


def test_a_low_rate_is_delivered_in_full(pg_dsn: str, tmp_path: Path) -> None:
    """rate="2/s" (a bucket of one token): 9 jobs start about 0.5 s apart, 4 s in all. The
    worker came back on its 0.2 s poll, up to 0.2 s after the token was due, and that time
    was lost (the bucket holds one): 0.6 s apart, 1.6 a second (found by a new user)."""
    enqueue(pg_dsn, "trickle", 9)
    worker = flow_worker(pg_dsn, tmp_path, "w1", "--exit-when-idle", procs=1)
    assert exit_code(worker, 60, tmp_path / "counts") == 0
    starts = sorted(r[3] for r in ledger(tmp_path / "counts"))
    assert len(starts) == 9
    assert most_starts_in_a_second(ledger(tmp_path / "counts")) <= 3  # N plus the burst of one
    assert starts[-1] - starts[0] < 4.45, [round(b - a, 3) for a, b in itertools.pairwise(starts)]


def test_a_paused_queue_is_not_claimed_until_it_resumes(pg_dsn: str, tmp_path: Path) -> None:
    """A running worker stops claiming a queue within a second of its pause; the other
    queues go on; on resume its jobs run."""
    worker = flow_worker(pg_dsn, tmp_path, "w1")
    try:
        execute(pg_dsn, "INSERT INTO shardworker.queues (name, paused) VALUES ('uploads', true)")
        time.sleep(1.0)
        held = enqueue(pg_dsn, "thumb", 20, queue="uploads")
        free = enqueue(pg_dsn, "limited", 5, {"sleep": 0.01})
        wait_for(lambda: query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE id = ANY(%s) "
                                       "AND status = 'done'", free)[0][0] == 5, 60, "the unpaused jobs")
        time.sleep(1.0)
        assert query(pg_dsn, "SELECT status, count(*) FROM shardworker.jobs WHERE id = ANY(%s) GROUP BY 1",
                     held) == [("queued", 20)]
        execute(pg_dsn, "UPDATE shardworker.queues SET paused = false WHERE name = 'uploads'")
        wait_for(lambda: query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE id = ANY(%s) "
                                       "AND status = 'done'", held)[0][0] == 20, 60, "the resumed queue")
    finally:
        kill_worker_group(worker)


def test_a_killed_worker_gives_its_global_slots_back_through_the_rescue(pg_dsn: str, tmp_path: Path) -> None:
    """A worker killed while its handlers hold all 5 slots of a kind: a peer rescues its jobs
    after --rescue-after (5 s here), and the kind's other jobs run on the peer."""
    stuck = enqueue(pg_dsn, "limited", 5, {"sleep": 600})
    first = flow_worker(pg_dsn, tmp_path, "w1", "--rescue-after", "5", "--shutdown-timeout", "1")
    wait_for(lambda: len(query(pg_dsn, "SELECT 1 FROM shardworker.jobs WHERE status = 'running'")) == 5,
             60, "the five slots to be taken")
    kill_worker_group(first)
    later = query(pg_dsn, "INSERT INTO shardworker.jobs (kind, payload) SELECT 'limited', '{\"sleep\": 0.01}' "
                          "FROM generate_series(1, 10) RETURNING id")
    peer = flow_worker(pg_dsn, tmp_path, "w2", "--rescue-after", "5", "--shutdown-timeout", "1")
    try:
        try:
            wait_for(lambda: query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE id = ANY(%s) AND "
                                           "status = 'done'", [r[0] for r in later])[0][0] == 10,
                     90, "the kind's other jobs to run once the slots came back")
        except AssertionError as exc:  # say what the workers and the rows said (a clean-clone run failed once)
            logs = {name: (tmp_path / "counts" / f"{name}.log").read_text()[-3000:] for name in ("w1", "w2")}
            workers = query(pg_dsn, "SELECT * FROM shardworker.workers")
            jobs = query(pg_dsn, "SELECT id, status, attempt, locked_by, run_at FROM shardworker.jobs")
            raise AssertionError(f"{exc}\n{logs}\n{workers}\n{jobs}") from None
        rescued = query(pg_dsn, "SELECT status FROM shardworker.jobs WHERE id = ANY(%s)", stuck)
        assert {s for (s,) in rescued} <= {"queued", "running"}
    finally:
        kill_worker_group(peer)


def test_a_dead_workers_global_slots_come_back_in_seconds_and_its_jobs_stay_its_own(
        pg_dsn: str, tmp_path: Path) -> None:
    """Worker A killed -9 while it runs 2 calls of a kind capped at 5 across workers, and not
    restarted: seconds after its silence (--release-slots-after, 10 s by default), worker B
    (rescue an hour away) runs 5 at once, not 3; A's two jobs are not rescued meanwhile (no
    re-run before the rescue)."""
    stuck = enqueue(pg_dsn, "limited", 2, {"sleep": 600})
    first = flow_worker(pg_dsn, tmp_path, "w1")
    wait_for(lambda: len(query(pg_dsn, "SELECT 1 FROM shardworker.jobs WHERE status = 'running'")) == 2,
             60, "A's two calls running")
    kill_worker_group(first)
    killed_at = time.time()
    later = sorted(set(enqueue(pg_dsn, "limited", 20, {"sleep": 3})) - set(stuck))
    peer = flow_worker(pg_dsn, tmp_path, "w2")
    try:
        wait_for(lambda: query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE id = ANY(%s) AND "
                                       "status = 'done'", later)[0][0] == 20, 90, "B to run the twenty")
        runs = [r for r in ledger(tmp_path / "counts") if r[1] in later]
        assert most_at_once(runs) == 5, f"B ran {most_at_once(runs)} at once, A's dead slots counted"
        assert min(r[3] for r in runs) - killed_at < 30  # seconds, not the hour of --rescue-after
        rows = query(pg_dsn, "SELECT status, attempt, locked_by FROM shardworker.jobs WHERE id = ANY(%s)", stuck)
        assert rows == [("running", 1, "w1")] * 2, rows
    finally:
        kill_worker_group(peer)


def test_exit_when_idle_leaves_a_paused_queue_for_later(pg_dsn: str, tmp_path: Path) -> None:
    """A paused queue's jobs wait for an operator: --exit-when-idle runs the rest and exits,
    leaving them queued."""
    execute(pg_dsn, "INSERT INTO shardworker.queues (name, paused) VALUES ('uploads', true)")
    held = enqueue(pg_dsn, "thumb", 5, queue="uploads")
    free = enqueue(pg_dsn, "limited", 5, {"sleep": 0.01})
    worker = flow_worker(pg_dsn, tmp_path, "w1", "--exit-when-idle")
    assert exit_code(worker, 60, tmp_path / "counts") == 0
    assert query(pg_dsn, "SELECT status, count(*) FROM shardworker.jobs WHERE id = ANY(%s) GROUP BY 1",
                 held) == [("queued", 5)]
    assert query(pg_dsn, "SELECT status, count(*) FROM shardworker.jobs WHERE id = ANY(%s) GROUP BY 1",
                 free) == [("done", 5)]
