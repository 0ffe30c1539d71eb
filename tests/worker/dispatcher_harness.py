"""The stand-ins ``Dispatcher.run_once`` is driven with in-process (tests/worker/test_dispatcher_*.py):
the store is a real ``PgStore`` behind ``FlakyStore`` (chosen calls fail), the children an
in-process stand-in that records what it was sent, the flusher one whose counts the test sets,
the clock injected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardworker.app import App
from shardworker.core import wire
from shardworker.core.config import WorkerConfig
from shardworker.core.jobstats import JobCounts
from shardworker.core.model import ClaimedJob
from shardworker.store.pg_store import PgStore, StoreConfig
from shardworker.worker.deaths import Death
from shardworker.worker.dispatcher import Dispatcher
from shardworker.worker.parent_outcomes import ParentOutcomes
from tests.clocks import FakeClock as Clock
from tests.flaky_store import FlakyStore
from tests.helpers import query


class Children:
    """Stands in for ``ChildPool``: keeps what it is sent; the test decides what finishes or dies."""

    def __init__(self, n: int, max_jobs: int) -> None:
        self.max_jobs, self.at_once = max_jobs, 1  # its share, and of it what one child runs at once
        self.sent: list[dict[wire.JobKey, ClaimedJob]] = [{} for _ in range(n)]
        self.finished = 0
        self.deaths: list[Death] = []
        self.job_counts = JobCounts()  # what the children's reports carried (steps recorded, for the backlog)
        self.attempts: dict[str, int] = {}  # no handler sets max_attempts
        self.cancelled: list[set[wire.JobKey]] = []  # the attempts each cancel stopped

    def __len__(self) -> int:
        return len(self.sent)

    def outstanding(self, index: int) -> int:
        return len(self.sent[index])

    def target(self, index: int) -> int:
        return self.max_jobs

    def held_bytes(self) -> int:
        return 0

    def cap_rooms(self) -> dict[str, int]:
        return {}

    def run_room(self) -> int:
        return sum(max(0, self.max_jobs - len(s)) for s in self.sent)

    @property
    def in_flight(self) -> int:
        return sum(len(s) for s in self.sent)

    def send(self, index: int, jobs: list[ClaimedJob]) -> None:
        self.sent[index].update({(j.id, j.attempt): j for j in jobs})

    def finish(self, index: int, count: int) -> None:
        for key in list(self.sent[index])[:count]:
            del self.sent[index][key]
            self.finished += 1

    def collect(self) -> int:
        finished, self.finished = self.finished, 0
        return finished

    def check(self) -> list[Death]:
        deaths, self.deaths = self.deaths, []
        return deaths

    def wait_fds(self) -> tuple[list[int], list[int]]:
        return [], []

    starting = False

    def cancel(self, keys: set[tuple[int, int | None]]) -> int:
        """Records the attempts held here that ``keys`` name, as the pool picks them."""
        from shardworker.worker.cancel_watch import matching

        chosen = set(matching(self.job_keys(), keys))
        self.cancelled.append(chosen)
        return len(chosen)

    def job_keys(self) -> list[wire.JobKey]:
        return [key for sent in self.sent for key in sent]

    def job_ids(self) -> list[int]:
        return [i for i, _ in self.job_keys()]

    def held_jobs(self) -> list[ClaimedJob]:
        return [job for sent in self.sent for job in sent.values()]


class Flusher:
    """Stands in for ``FlusherHandle``: the test sets how much was flushed; it checks the
    outbox's mark as soon as asked, and finds the database holds it (unless ``reapplying``)."""

    def __init__(self) -> None:
        self.flushed_total = 0
        self.batch_started_at = 0.0  # when the last batch applied began (the test's clock)
        self.idle = True
        self.failing = ""
        self.reapplying = False
        self.checks = 0  # checks of the mark asked for

    def check(self) -> None:
        pass

    def check_mark(self) -> int:
        self.checks += 1
        return self.checks

    def mark_checked(self, asked: int) -> bool:
        return not self.reapplying

    def counters(self) -> dict[str, Any]:
        return {"regressions": 0}


@pytest.fixture
def store(pg_dsn: str) -> Any:
    s = PgStore(StoreConfig(dsn=pg_dsn, connect_timeout_s=3, statement_timeout_s=5))
    yield FlakyStore(s)
    s.close()


def make(store: FlakyStore, tmp_path: Path, procs: int = 3, **config: Any) -> tuple[Dispatcher, Children, Flusher,
                                                                                    Clock]:
    app = App()
    app.handler("k", retry_delay=lambda attempt: 2.5)(lambda job: None)
    prefetch = config.pop("prefetch", 1000)
    settings = {"claim_batch": 500, "poll_interval_s": 0.01, **config}
    cfg = WorkerConfig(dsn="unused", app_ref="unused", procs=procs, outbox_dir=str(tmp_path), **settings)
    children, flusher, clock = Children(procs, prefetch), Flusher(), Clock(100.0)
    dispatcher = Dispatcher(cfg, "w1", ["k"], store, children, flusher,  # type: ignore[arg-type]
                            ParentOutcomes(str(tmp_path), 1 << 20, app.handlers), stopping=lambda: False, clock=clock)
    return dispatcher, children, flusher, clock


def job_rows(dsn: str) -> list[tuple[Any, ...]]:
    return query(dsn, "SELECT id, status, attempt, locked_by FROM shardworker.jobs ORDER BY id")
