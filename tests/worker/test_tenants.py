"""Many tenants on one queue, through real workers (tests/apps/tenant_app.py): one tenant
floods the queue while others enqueue a trickle behind it, two workers share the database,
and one of them is killed -9 mid-run. Counted from inside the handler: no tenant ever runs
more than its key_concurrency at once, across both workers; the trickle finishes long before
the flood; every job ends done, and only jobs the killed worker had started run again."""

from __future__ import annotations

import collections
import time
from pathlib import Path

from shardworker import JobSpec, enqueue_many
from tests.helpers import kill_worker_group, query, runs_per_job, start_worker, wait_for

KEY_CONCURRENCY = 2


def ledger(count_dir: Path) -> list[tuple[str, str, int, int, float]]:
    """(event, key, job id, attempt, time) of every run, from every process."""
    lines = []
    for path in count_dir.glob("tenants-*.log"):
        for line in path.read_text().splitlines():
            event, key, job_id, attempt, at = line.split()
            lines.append((event, key, int(job_id), int(attempt), float(at)))
    return lines


def most_at_once_by_key(events: list[tuple[str, str, int, int, float]], killed_at: float) -> dict[str, int]:
    """The most runs of each key at once; a run the kill cut short ended at the kill."""
    ends = {(k, j, a): at for e, k, j, a, at in events if e == "end"}
    moves = []
    for event, key, job_id, attempt, at in events:
        if event == "start":
            moves += [(at, 1, key), (ends.get((key, job_id, attempt), killed_at), -1, key)]
    most: dict[str, int] = collections.Counter()
    now: dict[str, int] = collections.Counter()
    for _, step, key in sorted(moves):
        now[key] += step
        most[key] = max(most[key], now[key])
    return dict(most)


def test_a_flooding_tenant_neither_exceeds_its_slots_nor_delays_the_others_through_a_kill(
        pg_dsn: str, tmp_path: Path) -> None:
    count_dir = tmp_path / "counts"
    count_dir.mkdir()
    flood = enqueue_many(pg_dsn, [JobSpec("render", {"sleep": 0.3}, key="acme") for _ in range(40)])
    trickle = enqueue_many(pg_dsn, [JobSpec("render", {"sleep": 0.3}, key=f"tenant-{n}")
                                    for n in range(4) for _ in range(3)])

    def worker(name: str):  # type: ignore[no-untyped-def]
        return start_worker(pg_dsn, tmp_path / f"outbox-{name}", count_dir, "--worker-id", name,
                            "--rescue-after", "15", "--rescue-grace", "1", "--shutdown-timeout", "1", app="tenant_app",
                            log_path=count_dir / f"{name}.log")

    first, second = worker("w1"), worker("w2")
    try:
        wait_for(lambda: query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE key = 'acme' AND "
                                       "status = 'running' AND locked_by = 'w1'")[0][0] >= 1, 60, "w1 running acme")
        time.sleep(0.2)  # a run under way
        kill_worker_group(first)
        killed_at = time.time()
        held = {i for (i,) in query(pg_dsn, "SELECT id FROM shardworker.jobs WHERE locked_by = 'w1'")}
        wait_for(lambda: query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE status = 'done'")[0][0] == 52,
                 120, "every job done after the kill (the rescue takes w1's held jobs back)")
    finally:
        kill_worker_group(second)
        kill_worker_group(first)
    events = ledger(count_dir)
    assert max(most_at_once_by_key(events, killed_at).values()) <= KEY_CONCURRENCY, most_at_once_by_key(events,
                                                                                                    killed_at)
    finished = dict(query(pg_dsn, "SELECT id, finished_at FROM shardworker.jobs"))
    acme_done = sorted(finished[i] for i in flood if i is not None)
    # (What the killed worker held waits for the rescue, whoever's it is.)
    assert max(finished[i] for i in trickle if i is not None and i not in held) < acme_done[20], \
        "the other tenants' jobs waited behind acme's backlog"
    rows = query(pg_dsn, "SELECT id, status, result FROM shardworker.jobs")
    assert all(status == "done" and result == {"id": job_id} for job_id, status, result in rows)
    started_before_kill = {j for e, _, j, _, at in events if e == "start" and at <= killed_at}
    again = {j for j, n in runs_per_job(count_dir).items() if n > 1}
    assert again <= started_before_kill, f"jobs ran again that no one had started before the kill: {again}"
