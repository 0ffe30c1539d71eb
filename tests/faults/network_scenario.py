"""One worker behind ``tests.proxy.PgProxy``, and the checks every network fault test makes
(``tests/faults/test_network_faults.py``): all jobs done with their results, each handler ran
once, the worker rode the fault out."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardworker.embedded import EmbeddedPostgres
from tests.helpers import (
    enqueue,
    kill_worker_group,
    query,
    runs,
    runs_per_job,
    start_worker,
    status_counts,
    worker_log,
)
from tests.proxy import PgProxy

NETWORK_TIMEOUT_S = 3
STATEMENT_TIMEOUT_S = 5
WORKER_ARGS = ("--backoff-cap", "1", "--network-timeout", str(NETWORK_TIMEOUT_S),
               "--statement-timeout", str(STATEMENT_TIMEOUT_S), "--prefetch", "500")  # work in hand
FLUSH = (b"applied_attempt = o.attempt",)  # job_apply_outcomes, the flusher's batch (job_claim has unnest too)
CLAIM = (b"FOR UPDATE SKIP LOCKED", b"UPDATE shardworker.jobs")  # job_claim
SLOW = {"sleep": 0.005}
STALL_S = 8.0  # job counts unchanged this long after a fault ended: the worker is stuck (backoff cap is 1 s)
# Through a proxy, keepalives and TCP_USER_TIMEOUT never fire (the proxy's kernel ACKs everything): only the
# worker's client-side deadline (statement timeout + network timeout) can notice a black hole mid-statement.
BLACKHOLE_S = STATEMENT_TIMEOUT_S + NETWORK_TIMEOUT_S + 2
SHUTDOWN_BOUND_S = 30  # SIGTERM in a black hole: a blocked statement's deadline, then the shutdown steps


class Scenario:
    """One worker behind the proxy, plus what the test needs to check it."""

    def __init__(self, server: EmbeddedPostgres, proxy: PgProxy, tmp_path: Path) -> None:
        self.dsn, self.proxy = server.dsn, proxy
        self.outbox_dir, self.count_dir = tmp_path / "outbox", tmp_path / "counts"
        self.count_dir.mkdir()
        self.proc: subprocess.Popen[bytes] | None = None
        self.ids: list[int] = []
        self.expected: dict[int, Any] = {}

    def enqueue(self, kind: str, count: int, payload: Any = None) -> None:
        before = set(self.ids)
        self.ids = enqueue(self.dsn, kind, count, payload)  # all ids of this kind (one kind per test)
        for job_id in set(self.ids) - before:
            self.expected[job_id] = {"id": job_id, "echo": payload} if kind == "count" else {"id": job_id}

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        self.proc = start_worker(self.proxy.dsn, self.outbox_dir, self.count_dir, *WORKER_ARGS, *args, procs=2)
        return self.proc

    def done(self) -> int:
        return status_counts(self.dsn).get("done", 0)

    def context(self) -> str:
        return (f"\nproxy mode {self.proxy.mode}; last proxy events: {self.proxy.events()[-8:]}"
                f"\n--- worker log (tail) ---\n{worker_log(self.count_dir)[-4000:]}")

    def assert_alive(self, during: str) -> None:
        assert self.proc is not None and self.proc.poll() is None, f"the worker exited during {during}" + \
            self.context()

    def wait_all_done(self, timeout_s: float, stall_s: float = STALL_S) -> None:
        """Wait until every job is done; fail early once the job counts stop changing for ``stall_s``."""
        self._wait(lambda: status_counts(self.dsn) == {"done": len(self.ids)}, timeout_s, stall_s,
                   f"all {len(self.ids)} jobs done")

    def _wait(self, finished: Callable[[], bool], timeout_s: float, stall_s: float, what: str) -> None:
        started = changed = time.monotonic()
        last: dict[str, int] = {}
        while not finished():
            counts, now = status_counts(self.dsn), time.monotonic()
            if counts != last:
                last, changed = counts, now
            if now - started > timeout_s or (now - changed > stall_s and last != {"done": len(self.ids)}):
                raise AssertionError(f"no {what} after {now - started:.1f}s (counts unchanged for "
                                     f"{now - changed:.1f}s): {last}" + self.context())
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM: the worker must exit 0."""
        assert self.proc is not None
        self.assert_alive("the run")
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0, "the worker did not exit 0 on SIGTERM" + self.context()

    def wait_idle_exit(self, timeout_s: float, stall_s: float = STALL_S) -> None:
        """--exit-when-idle: the worker must exit 0 by itself."""
        proc = self.proc
        assert proc is not None
        self._wait(lambda: proc.poll() is not None, timeout_s, stall_s, "exit when idle")
        assert proc.returncode == 0, f"the worker exited {proc.returncode}" + self.context()

    def assert_each_job_done_once(self, max_attempt: int = 1) -> None:
        rows = query(self.dsn, "SELECT id, status, result, attempt, locked_by FROM shardworker.jobs ORDER BY id")
        assert [r[0] for r in rows] == self.ids
        bad = [r for r in rows
               if (r[1], r[2], r[4]) != ("done", self.expected[r[0]], None) or not 1 <= r[3] <= max_attempt]
        assert not bad, f"{len(bad)} jobs not done once with their result, e.g. {bad[:3]}" + self.context()
        twice = {key: n for key, n in runs(self.count_dir).items() if n > 1}
        assert not twice, f"handlers ran twice for one (job id, attempt): {list(twice)[:10]}"
        per_job = runs_per_job(self.count_dir)
        assert set(per_job) == set(self.ids), "a job has no handler run recorded"
        reran = sorted(j for j, n in per_job.items() if n > 1)
        assert not reran, f"jobs ran more than once: {reran[:10]}" + self.context()
        assert "stale outcomes" not in worker_log(self.count_dir), "a replay was counted as stale"

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            kill_worker_group(self.proc)
