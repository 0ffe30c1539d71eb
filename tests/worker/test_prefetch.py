"""The adaptive prefetch of ``ChildPool``: each child's target starts at the minimum, grows with
the rate it finishes jobs, is capped, and decays when it stalls. In-process, fake clock."""

from __future__ import annotations

from tests.clocks import FakeClock


def _pool(clock: FakeClock, *, min_jobs: int = 65, max_jobs: int = 1001, horizon_s: float = 0.1):
    from shardworker.worker.pool import ChildPool
    from tests.helpers import child_config

    configs = [child_config(i, "/nonexistent") for i in range(2)]
    return ChildPool(configs, {}, min_jobs=min_jobs, max_jobs=max_jobs, max_bytes=1 << 20,
                     horizon_s=horizon_s, clock=clock)


def test_prefetch_target_starts_at_the_minimum_and_grows_with_a_childs_rate() -> None:
    clock = FakeClock()
    pool = _pool(clock)
    assert pool.target(0) == pool.target(1) == 65
    for _ in range(20):  # child 0 finishes 2,000 jobs/s for 5 s; child 1 nothing
        for _ in range(25):
            clock.now += 0.01
            pool.handles[0].pace.finished(20, clock.now)
    assert pool.target(1) == 65
    assert 65 + 150 <= pool.target(0) <= 65 + 200  # about 0.1 s of 2,000/s on top of the minimum


def test_prefetch_target_is_capped_and_decays_to_the_minimum_when_a_child_stalls() -> None:
    clock = FakeClock()
    pool = _pool(clock)
    for _ in range(400):  # 100,000 jobs/s: far over the cap
        clock.now += 0.01
        pool.handles[0].pace.finished(1000, clock.now)
    assert pool.target(0) == 1001
    targets = []
    for _ in range(12):  # a slow handler: nothing finishes for 3 s
        clock.now += 0.25
        targets.append(pool.target(0))
    assert targets == sorted(targets, reverse=True)
    assert targets[-1] <= 65 + 5
