"""What the demos that stop their own PostgreSQL share (``demo --outage``, ``demo --steps``).

A ``Stage`` is one demo's embedded PostgreSQL, under a directory of the demo's own in
``.shardworker/`` (so no other database is ever stopped), migrated, with one connection for
counting; a worker run as a real subprocess (``shardworker run``, its log in that
directory); and a ledger directory the demo's handlers append to and fsync, so a run could
not hide. ``Display`` prints the phases, and on a terminal a progress line redrawn in place.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

import outbox
from shardworker.client import JobSpec, enqueue_many
from shardworker.core.dsn import redact_dsn
from shardworker.embedded import EmbeddedPostgres, ensure_embedded
from shardworker.errors import ShardworkerError
from shardworker.store.migrate import apply_migrations
from shardworker.store.pg_store import PgStore, StoreConfig
from shardworker.worker.drain import drain

LEDGER_ENV = "SHARDWORKER_DEMO_LEDGER"


class DemoFailed(ShardworkerError):
    pass


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


def table(rows: list[tuple[str, str]]) -> str:
    """Rows of (name, value) between two rules, the values aligned."""
    width = max(len(name) for name, _ in rows)
    line = "-" * (width + 2 + max(len(v) for _, v in rows))
    body = "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
    return f"{line}\n{body}\n{line}"


class Stage:
    """One demo's own embedded PostgreSQL, its worker subprocess and its ledger. Closing it
    brings PostgreSQL back if the demo stopped there (Ctrl-C mid-outage: the worker's outcomes
    then land), stops the worker, and stops the server: it does not outlive the demo, nor a
    start that failed."""

    def __init__(self, name: str, queue: str, display: Display) -> None:
        self.shown = Path(".shardworker") / name  # as the phases name it
        self.base = self.shown.absolute()
        self.outbox_dir, self.ledger_dir, self.log_path = self.base / "outbox", self.base / "ledger", \
            self.base / "worker.log"
        self.queue, self.display = queue, display
        self.worker: subprocess.Popen[bytes] | None = None
        self.down = False
        display.phase(f"starting an embedded PostgreSQL of the demo's own in {self.shown}/ …")
        try:
            self.dsn = ensure_embedded(self.base)
            self.server = EmbeddedPostgres(self.base / "pgdata")  # on the port the start saved
            apply_migrations(self.dsn)
        except BaseException:  # a failure or Ctrl-C before the demo began: the server is not left running
            EmbeddedPostgres(self.base / "pgdata").stop()
            raise
        self.store = PgStore(StoreConfig(dsn=self.dsn, connect_timeout_s=2))  # the demo's one connection

    def __enter__(self) -> Stage:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            try:
                if self.down:
                    self.display.phase("starting PostgreSQL again, so the worker can store its outcomes before "
                                       "it stops …")
                    self.start_db()
            finally:
                self.stop_worker()
        finally:
            self.store.close()
            self.server.stop()

    def fresh(self) -> None:
        """Start from nothing: no jobs in the demo's queue, an empty outbox, an empty ledger.
        Outcomes an interrupted run left in the outbox are drained into the database first."""
        if self.outbox_dir.exists() and (pending := self.pending()):
            self.display.phase(f"draining {pending:,} outcomes an earlier, interrupted run left in "
                               f"{self.outbox_dir} …")
            drain(str(self.outbox_dir), self.dsn, timeout_s=120)
        self.store.delete_queue(self.queue)
        self.ledger_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for name in os.listdir(self.ledger_dir):
            os.unlink(self.ledger_dir / name)

    def run_into_outage(self, kind: str, jobs: int, what: str, app_ref: str, procs: int, *args: str) -> None:
        """The demos' opening: a fresh start, ``jobs`` jobs of ``kind`` (``what`` names them),
        the worker started, and PostgreSQL stopped once a fifth of them are done."""
        self.fresh()
        enqueue_many(self.dsn, [JobSpec(kind, {"n": i}, queue=self.queue) for i in range(jobs)])
        command = " ".join(("shardworker run --procs", str(procs), *args))
        self.display.phase(f"enqueued {jobs:,} {what} on {redact_dsn(self.dsn)}; starting `{command}` "
                           f"(log: {self.shown}/worker.log)")
        self.start_worker(app_ref, procs, *args)
        self.wait(lambda: self.counts().get("done", 0) >= max(1, jobs // 5), 120,
                  "the first fifth of the jobs to be done")
        self.display.phase("stopping PostgreSQL mid-run (pg_ctl stop -m immediate) …")
        self.stop_db()

    def start_worker(self, app_ref: str, procs: int, *args: str) -> None:
        """``shardworker run --app APP_REF`` on the demo's queue and outbox, in a session of its own."""
        # The DSN holds the server's superuser password: it goes in the environment, which only
        # this user (and root) can read, never in argv, which every local user can (/proc/PID/cmdline).
        env = {**os.environ, LEDGER_ENV: str(self.ledger_dir), "SHARDWORKER_DSN": self.dsn}
        with open(self.log_path, "ab") as log:
            self.worker = subprocess.Popen(
                [sys.executable, "-m", "shardworker", "run", "--app", app_ref, "--procs", str(procs),
                 "--queues", self.queue, "--outbox-dir", str(self.outbox_dir), "--backoff-cap", "1",
                 "--retention", "0", *args],
                stdout=log, stderr=log, env=env, start_new_session=True)

    def stop_worker(self) -> None:
        """SIGTERM, then SIGKILL to its whole session after 60 s, or at once on a second Ctrl-C
        (it runs in a session of its own, so nothing else would stop it)."""
        worker = self.worker
        if worker is None or worker.poll() is not None:
            return
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            self.kill_worker()
        except KeyboardInterrupt:
            self.kill_worker()
            raise

    def kill_worker(self) -> None:
        """kill -9 of every process of the worker: parent, children and flusher."""
        if self.worker is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.worker.pid, signal.SIGKILL)
            self.worker.wait(10)

    def stop_db(self) -> None:
        """A crash, not a polite shutdown: ``pg_ctl stop -m immediate``."""
        self.down = True
        self.server.stop("immediate")
        self.store.close()  # its connection died with the server; the next count opens a new one

    def start_db(self) -> None:
        self.server.start()
        self.down = False

    def check_alive(self) -> None:
        if self.worker is not None and self.worker.poll() is not None:
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-1:]
            raise DemoFailed(f"the worker exited ({self.worker.returncode}): {tail[0] if tail else 'no log'}")

    def wait(self, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            self.check_alive()
            if time.monotonic() > deadline:
                raise DemoFailed(f"timed out waiting for {what}")
            time.sleep(0.1)

    def show_for(self, seconds: float, line: Callable[[], str], clock: Callable[[], float]) -> None:
        """Redraw ``line()`` for ``seconds`` from now, the worker alive throughout."""
        until = clock() + seconds
        while clock() < until:
            self.display.progress(line())
            self.check_alive()
            time.sleep(0.2)

    def run_to_the_end(self, jobs: int, back_at: float, clock: Callable[[], float]) -> float:
        """With PostgreSQL back since ``back_at``: show the outbox draining until every job
        is done. Returns how long the outbox took to empty."""
        drained_at = None
        while True:
            pending = self.pending()
            if pending == 0 and drained_at is None:
                drained_at = clock()
            done = self.counts().get("done", 0)
            self.display.progress(f"PostgreSQL back | outbox pending {pending:,} | done {done:,}/{jobs:,}")
            if done >= jobs and pending == 0:
                break
            self.check_alive()
            if clock() - back_at > 300:
                raise DemoFailed(f"jobs not done 300 s after PostgreSQL came back; see {self.shown}/worker.log")
            time.sleep(0.1)
        return (drained_at or clock()) - back_at

    def pending(self) -> int:
        """Records waiting in the outbox (read from its files: works with PostgreSQL down)."""
        return outbox.status(str(self.outbox_dir)).pending

    def counts(self) -> dict[str, int]:
        """The demo's jobs by status."""
        return {status: n for queue, status, n in self.store.stats() if queue == self.queue}

    def ledger(self) -> Iterator[list[str]]:
        """Every line the handlers appended to the ledger, split into words."""
        for name in os.listdir(self.ledger_dir):
            with open(self.ledger_dir / name) as lines:
                yield from (line.split() for line in lines if line.strip())

