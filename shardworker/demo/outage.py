"""``shardworker demo --outage``: the promise, live.

On an embedded PostgreSQL of its own (under ``.shardworker/outage-demo/``, so no other
database is ever stopped), the demo enqueues jobs and starts a real worker
(``shardworker run``, a subprocess, its log in the demo's directory). Once part of the
work is done it stops PostgreSQL (``pg_ctl stop -m immediate``: a crash, not a polite
shutdown), shows the outbox filling while the children finish what they hold, starts
PostgreSQL again, shows the outbox draining, and ends with a table: jobs, handler runs,
re-runs, how long the database was away, how many outcomes waited, how long they took to
land. Each handler run is counted from inside the handler, in a ledger file it appends to
and fsyncs, so a re-run could not hide.

On a terminal the progress line redraws in place; otherwise only the phases are printed.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import outbox
from shardworker.client import JobSpec, enqueue_many
from shardworker.dsn import redact_dsn
from shardworker.errors import ShardworkerError
from shardworker.flusher.drain import drain
from shardworker.store.embedded import EmbeddedPostgres, ensure_embedded
from shardworker.store.migrate import apply_migrations
from shardworker.store.pg_store import PgStore, StoreConfig

BASE_DIR = Path(".shardworker") / "outage-demo"
LEDGER_ENV = "SHARDWORKER_DEMO_LEDGER"
QUEUE = "outage-demo"


class DemoFailed(ShardworkerError):
    pass


@dataclass
class Result:
    jobs: int
    handler_runs: int
    rerun_jobs: int
    outage_s: float
    peak_pending: int
    drain_s: float
    statuses: dict[str, int]

    def table(self) -> str:
        rows = [("jobs", f"{self.jobs:,}"),
                ("handler runs", f"{self.handler_runs:,}"),
                ("re-runs", f"{self.rerun_jobs:,}"),
                ("PostgreSQL down", f"{self.outage_s:.1f} s (stopped with pg_ctl -m immediate)"),
                ("outcomes that waited", f"{self.peak_pending:,} (fsync'd in the outbox, on local disk)"),
                ("time to drain", f"{self.drain_s:.1f} s (from PostgreSQL back to the outbox empty)"),
                ("final rows", ", ".join(f"{status} {n:,}" for status, n in sorted(self.statuses.items())))]
        width = max(len(name) for name, _ in rows)
        line = "-" * (width + 2 + max(len(v) for _, v in rows))
        body = "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
        return f"{line}\n{body}\n{line}"


class Display:
    """A progress line redrawn in place on a terminal; nothing but the phases elsewhere."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.live = stream, stream.isatty()
        self._drawn = False

    def phase(self, text: str) -> None:
        if self._drawn:
            self.stream.write("\n")
            self._drawn = False
        self.stream.write(text + "\n")
        self.stream.flush()

    def progress(self, text: str) -> None:
        if self.live:
            self.stream.write("\r\033[K" + text)
            self.stream.flush()
            self._drawn = True


def run(jobs: int, procs: int, outage_s: float, stream: TextIO = sys.stderr,
        clock: Callable[[], float] = time.monotonic) -> Result:
    base = BASE_DIR.absolute()
    display = Display(stream)
    display.phase(f"starting an embedded PostgreSQL of the demo's own in {BASE_DIR}/ …")
    dsn = ensure_embedded(base)
    server = EmbeddedPostgres(base / "pgdata")
    apply_migrations(dsn)
    store = PgStore(StoreConfig(dsn=dsn, connect_timeout_s=2))  # the demo's one connection, for counting
    try:
        return _run(dsn, server, store, jobs, procs, outage_s, display, clock)
    finally:
        store.close()
        # The demo's server is the demo's alone: it does not outlive the demo.
        server.stop()


def _run(dsn: str, server: EmbeddedPostgres, store: PgStore, jobs: int, procs: int, outage_s: float,
         display: Display, clock: Callable[[], float]) -> Result:
    base = BASE_DIR.absolute()
    outbox_dir, ledger_dir = base / "outbox", base / "ledger"
    _fresh(dsn, store, outbox_dir, ledger_dir, display)
    enqueue_many(dsn, [JobSpec("demo.outage", {"n": i}, queue=QUEUE) for i in range(jobs)])
    display.phase(f"enqueued {jobs:,} jobs on {redact_dsn(dsn)}; starting `shardworker run --procs {procs}` "
                  f"(log: {BASE_DIR}/worker.log)")
    worker = _start_worker(dsn, procs, outbox_dir, ledger_dir, base / "worker.log")
    stopped = False
    try:
        _wait(lambda: _counts(store).get("done", 0) >= max(1, jobs // 5), 120, worker, base,
              "the first fifth of the jobs to be done")
        display.phase("stopping PostgreSQL mid-run (pg_ctl stop -m immediate) …")
        stopped = True
        server.stop("immediate")
        store.close()  # its connection died with the server; the next count opens a new one
        peak, down_at = _show_outage(outbox_dir, ledger_dir, jobs, outage_s, worker, base, display, clock)
        display.phase(f"{peak:,} outcomes waited in the outbox; starting PostgreSQL again …")
        server.start()
        stopped = False
        back_at = clock()
        outage = back_at - down_at
        drain = _show_draining(store, outbox_dir, jobs, back_at, worker, base, display, clock)
        display.phase("every job done; stopping the worker")
    finally:
        try:
            if stopped:  # interrupted mid-outage (Ctrl-C): bring PostgreSQL back so the worker's outcomes land
                display.phase("starting PostgreSQL again, so the worker can store its outcomes before it stops …")
                server.start()
        finally:
            _stop(worker)
    runs = _runs_per_job(ledger_dir)
    return Result(jobs, sum(runs.values()), sum(1 for n in runs.values() if n > 1), outage, peak, drain,
                  _counts(store))


def _show_outage(outbox_dir: Path, ledger_dir: Path, jobs: int, outage_s: float, worker: subprocess.Popen[bytes],
                 base: Path, display: Display, clock: Callable[[], float]) -> tuple[int, float]:
    """For ``outage_s`` from now, with PostgreSQL down: show the handler runs and the outbox
    filling. Returns the most outcomes that waited in the outbox, and when the outage began."""
    peak, down_at = 0, clock()
    while clock() - down_at < outage_s:
        pending = outbox.status(str(outbox_dir)).pending
        peak = max(peak, pending)
        display.progress(f"PostgreSQL down {clock() - down_at:4.1f}s | handler runs {_runs(ledger_dir):,}"
                         f"/{jobs:,} | outcomes waiting in the outbox {pending:,}")
        _check_alive(worker, base)
        time.sleep(0.2)
    return max(peak, outbox.status(str(outbox_dir)).pending), down_at


def _show_draining(store: PgStore, outbox_dir: Path, jobs: int, back_at: float, worker: subprocess.Popen[bytes],
                   base: Path, display: Display, clock: Callable[[], float]) -> float:
    """With PostgreSQL back since ``back_at``: show the outbox draining until every job is
    done. Returns how long the outbox took to empty."""
    drained_at = None
    while True:
        pending = outbox.status(str(outbox_dir)).pending
        if pending == 0 and drained_at is None:
            drained_at = clock()
        done = _counts(store).get("done", 0)
        display.progress(f"PostgreSQL back | outbox pending {pending:,} | done {done:,}/{jobs:,}")
        if done >= jobs and pending == 0:
            break
        _check_alive(worker, base)
        if clock() - back_at > 300:
            raise DemoFailed(f"jobs not done 300 s after PostgreSQL came back; see {BASE_DIR}/worker.log")
        time.sleep(0.1)
    return (drained_at or clock()) - back_at


def _fresh(dsn: str, store: PgStore, outbox_dir: Path, ledger_dir: Path, display: Display) -> None:
    """Start from nothing: no demo jobs, an empty outbox, an empty ledger. Outcomes an
    interrupted run left in the outbox are drained into the demo's database first."""
    if outbox_dir.exists() and (pending := outbox.status(str(outbox_dir)).pending):
        display.phase(f"draining {pending:,} outcomes an earlier, interrupted run left in {outbox_dir} …")
        drain(str(outbox_dir), dsn, timeout_s=120)
    store.delete_queue(QUEUE)
    ledger_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name in os.listdir(ledger_dir):
        os.unlink(ledger_dir / name)


def _start_worker(dsn: str, procs: int, outbox_dir: Path, ledger_dir: Path, log_path: Path) -> subprocess.Popen[bytes]:
    # The DSN holds the server's superuser password: it goes in the environment, which only
    # this user (and root) can read, never in argv, which every local user can (/proc/PID/cmdline).
    env = {**os.environ, LEDGER_ENV: str(ledger_dir), "SHARDWORKER_DSN": dsn}
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "shardworker", "run", "--app", "shardworker.demo.app:app", "--procs", str(procs),
             "--queues", QUEUE, "--outbox-dir", str(outbox_dir), "--prefetch", "400", "--backoff-cap", "1",
             "--retention", "0"],
            stdout=log, stderr=log, env=env, start_new_session=True)


def _stop(worker: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL to its whole session after 60 s, or at once on a second Ctrl-C
    (it runs in a session of its own, so nothing else would stop it)."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)
        except KeyboardInterrupt:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)
            raise


def _check_alive(worker: subprocess.Popen[bytes], base: Path) -> None:
    if worker.poll() is not None:
        tail = (base / "worker.log").read_text(errors="replace").strip().splitlines()[-1:]
        raise DemoFailed(f"the worker exited ({worker.returncode}): {tail[0] if tail else 'no log'}")


def _wait(predicate: Callable[[], bool], timeout_s: float, worker: subprocess.Popen[bytes], base: Path,
          what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        _check_alive(worker, base)
        if time.monotonic() > deadline:
            raise DemoFailed(f"timed out waiting for {what}")
        time.sleep(0.1)


def _counts(store: PgStore) -> dict[str, int]:
    return {status: n for queue, status, n in store.stats() if queue == QUEUE}


def _runs_per_job(ledger_dir: Path) -> collections.Counter[int]:
    runs: collections.Counter[int] = collections.Counter()
    for name in os.listdir(ledger_dir):
        with open(ledger_dir / name) as ledger:
            runs.update(int(line.split()[0]) for line in ledger if line.strip())
    return runs


def _runs(ledger_dir: Path) -> int:
    return sum(_runs_per_job(ledger_dir).values())
