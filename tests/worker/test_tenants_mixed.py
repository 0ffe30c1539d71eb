"""Keys beside the rest of scheduling, through two real workers (tests/apps/tenant_mixed_app.py):
a tenant floods ``render`` while another trickles, a slow ``partner`` kind is capped at 2
across workers, and fast ``thumb`` jobs arrive in a queue of their own. Counted from inside
the handlers: no tenant over its key_concurrency, the partner never over 2; the trickle and
the thumbs finish long before the flood does."""

from __future__ import annotations

import collections
from pathlib import Path

from shardworker import JobSpec, enqueue_many
from tests.helpers import kill_worker_group, query, start_worker, wait_for


def most_at_once(count_dir: Path) -> dict[str, int]:
    """The most runs at once of each tenant ("render:KEY") and of each other kind."""
    moves = []
    for path in count_dir.glob("mixed-*.log"):
        for line in path.read_text().splitlines():
            event, kind, key, _, _, at = line.split()
            moves.append((float(at), 1 if event == "start" else -1, f"{kind}:{key}" if kind == "render" else kind))
    now: dict[str, int] = collections.Counter()
    most: dict[str, int] = collections.Counter()
    for _, step, name in sorted(moves, key=lambda m: (m[0], m[1])):
        now[name] += step
        most[name] = max(most[name], now[name])
    return dict(most)


def test_tenants_take_turns_beside_a_capped_slow_kind_and_a_fast_queue(pg_dsn: str, tmp_path: Path) -> None:
    count_dir = tmp_path / "counts"
    count_dir.mkdir()
    flood = enqueue_many(pg_dsn, [JobSpec("render", key="acme") for _ in range(80)])
    enqueue_many(pg_dsn, [JobSpec("partner") for _ in range(8)])
    trickle = enqueue_many(pg_dsn, [JobSpec("render", key="beta") for _ in range(4)])
    thumbs = enqueue_many(pg_dsn, [JobSpec("thumb", queue="uploads") for _ in range(100)])
    workers = [start_worker(pg_dsn, tmp_path / f"outbox-{n}", count_dir, "--worker-id", f"w{n}",
                            "--shutdown-timeout", "1", app="tenant_mixed_app", log_path=count_dir / f"w{n}.log")
               for n in (1, 2)]
    try:
        wait_for(lambda: query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE status = 'done'")[0][0] == 192,
                 120, "every job done")
    finally:
        for worker in workers:
            kill_worker_group(worker)
    most = most_at_once(count_dir)
    assert most["render:acme"] <= 2 and most["render:beta"] <= 2 and most["partner"] <= 2, most
    finished = dict(query(pg_dsn, "SELECT id, finished_at FROM shardworker.jobs"))
    acme_done = sorted(finished[i] for i in flood if i is not None)
    assert max(finished[i] for i in trickle if i is not None) < acme_done[20]
    assert max(finished[i] for i in thumbs if i is not None) < acme_done[40]
