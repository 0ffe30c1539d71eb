"""A held xmin horizon: ``shardworker run`` at a steady 800 jobs/s while minute 2 holds an
open REPEATABLE READ transaction that has read a row (issue 27 point 1).

For 3 minutes, ``--writers`` client processes (default 2) each enqueue single no-op jobs on
their own autocommit connection (``shardworker.enqueue``, as an application does) at
``--rate`` jobs/s in all (default 800); one ``shardworker run --procs 2`` works them. From
minute 1 to minute 2 a side connection holds ``BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT ... FROM shardworker.jobs LIMIT 1``: vacuum can remove nothing that died after its
snapshot. Per 10 s window it prints jobs enqueued/s and done/s, the claim statement's p50/p99, enqueue ->
done p99 (of the jobs enqueued in the window), the backlog at the window's end,
``n_dead_tup`` of ``shardworker.jobs``, the size of ``jobs_claim_idx`` and the pages one
read-only scan of the first 64 due queued jobs touched (``EXPLAIN (ANALYZE, BUFFERS)``); then the targets.

Claim latency is the server's own: the bench sets ``log_min_duration_statement = 0`` for the
database (its own sessions turn it off again) and ``log_line_prefix = '%n [%p] '`` (epoch
timestamps), and reads each ``execute`` of the worker's claim statement from the server log:
every real claim, timed where it runs, with no extra load on the table. On an embedded
server (the default) the log is found by itself; with ``--dsn`` pass ``--server-log PATH``
(superuser needed for the settings), or the claim columns print ``-``.

Usage::

    python bench/horizon.py                          # embedded PostgreSQL, 3 minutes
    python bench/horizon.py --minutes-scale 0.1      # an 18 s smoke run (1 s windows)
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from horizon_report import Window, print_report
from latency import start_worker, wait_done
from throughput import KIND, code_version, database, write_app

from shardworker.client import enqueue

# The first line of the claim statement as the server logs it (queries.sql keeps comments).
CLAIM_MARK = "-- Claim due queued jobs for one worker"
LOG_LINE = re.compile(r"^(\d+\.\d+) \[\d+\] LOG:  duration: ([\d.]+) ms  execute [^:]*: (.*)$")


def quiet_connect(dsn: str) -> psycopg.Connection:
    """An autocommit connection whose statements the server does not log (the bench's own)."""
    conn = psycopg.connect(dsn, autocommit=True)
    with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
        conn.execute("SET log_min_duration_statement = -1")
    return conn


def writer(dsn: str, rate: float, start: float, stop: float, results: multiprocessing.Queue) -> None:
    """Enqueue single no-op jobs at ``rate`` from ``start`` to ``stop`` (epoch seconds) on a
    schedule, never past ``stop``; report (jobs enqueued, worst lag behind the schedule in s)."""
    enqueued, worst_lag = 0, 0.0
    with quiet_connect(dsn) as conn:
        time.sleep(max(0.0, start - time.time()))
        while (due := start + enqueued / rate) < stop and (now := time.time()) < stop:
            if now < due:
                time.sleep(due - now)
            worst_lag = max(worst_lag, now - due)
            enqueue(conn, KIND)
            enqueued += 1
    results.put((enqueued, worst_lag))


@contextlib.contextmanager
def claim_logging(dsn: str) -> Iterator[bool]:
    """Log every statement of the database's new sessions with epoch timestamps; whether it could."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        db = conn.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        try:
            conn.execute("ALTER SYSTEM SET log_line_prefix = '%n [%p] '")
            conn.execute(f'ALTER DATABASE "{db}" SET log_min_duration_statement = 0')
            conn.execute("SELECT pg_reload_conf()")
        except psycopg.errors.InsufficientPrivilege:
            yield False
            return
    try:
        yield True
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{db}" RESET log_min_duration_statement')
            conn.execute("ALTER SYSTEM RESET log_line_prefix")
            conn.execute("SELECT pg_reload_conf()")


def server_log(dsn: str, given: str | None) -> Path | None:
    """The server's log: ``--server-log``, else the embedded layout's ``<run>/postgres.log``."""
    if given:
        return Path(given)
    with quiet_connect(dsn) as conn:
        try:
            datadir = conn.execute("SHOW data_directory").fetchone()[0]  # type: ignore[index]
        except psycopg.errors.InsufficientPrivilege:
            return None
    path = Path(datadir).parent / "postgres.log"
    return path if path.is_file() else None


def claim_times(log: Path | None, offset: int) -> list[tuple[float, float]]:
    """(epoch, ms) of each claim the server logged after byte ``offset`` of its log."""
    if log is None:
        return []
    with log.open("rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    return [(float(m[1]), float(m[2])) for line in text.splitlines()
            if (m := LOG_LINE.match(line)) and m[3].startswith(CLAIM_MARK)]


# The claim's walk alone, read-only: the pages one scan of the queued jobs touches.
PROBE = ("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT id FROM shardworker.jobs "
         "WHERE status = 'queued' AND run_at <= now() ORDER BY priority, run_at, id LIMIT 64")


def sample(conn: psycopg.Connection) -> tuple[int, int, int]:
    """(n_dead_tup of shardworker.jobs, bytes of jobs_claim_idx, pages the probe touched) now."""
    row = conn.execute("SELECT n_dead_tup, pg_relation_size('shardworker.jobs_claim_idx') "
                       "FROM pg_stat_user_tables WHERE relid = 'shardworker.jobs'::regclass").fetchone()
    assert row is not None
    plan = conn.execute(PROBE).fetchone()[0][0]["Plan"]  # type: ignore[index]
    return int(row[0]), int(row[1]), int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


def drive(dsn: str, args: argparse.Namespace, start: float) -> list[tuple[int, int, int]]:
    """Run the writers from ``start``, hold the horizon in minute 2, sample every window;
    the samples, one per window."""
    window, minute = 10 * args.minutes_scale, 60 * args.minutes_scale
    stop = start + 3 * minute
    results: multiprocessing.Queue = multiprocessing.Queue()
    writers = [multiprocessing.Process(target=writer, args=(dsn, args.rate / args.writers, start, stop, results))
               for _ in range(args.writers)]
    for w in writers:
        w.start()
    samples: list[tuple[int, int, int]] = []
    with quiet_connect(dsn) as side, quiet_connect(dsn) as holder:
        for n in range(1, round(3 * minute / window) + 1):
            time.sleep(max(0.0, start + n * window - time.time()))
            samples.append(sample(side))
            if abs(n * window - minute) < 1e-6:
                holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                holder.execute("SELECT id FROM shardworker.jobs ORDER BY id LIMIT 1").fetchone()
            elif abs(n * window - 2 * minute) < 1e-6:
                holder.execute("COMMIT")
    got = [results.get(timeout=60) for _ in writers]
    for w in writers:
        w.join()
    print(f"enqueued {sum(n for n, _ in got)} jobs (target {args.rate * 3 * minute:.0f}); worst writer lag "
          f"{max(lag for _, lag in got) * 1000:.0f} ms", flush=True)
    return samples


def windows(dsn: str, start: float, width: float, samples: list[tuple[int, int, int]],
            claims: list[tuple[float, float]]) -> list[Window]:
    """Per window, from the table (the server's clock) and the samples."""
    sql = ("SELECT w, (SELECT count(*) FROM shardworker.jobs WHERE created_at >= to_timestamp(%(s)s + w * %(d)s) "
           "          AND created_at < to_timestamp(%(s)s + (w + 1) * %(d)s)), "
           " (SELECT count(*) FROM shardworker.jobs WHERE finished_at >= to_timestamp(%(s)s + w * %(d)s) "
           "          AND finished_at < to_timestamp(%(s)s + (w + 1) * %(d)s)), "
           " (SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at)) "
           "  FROM shardworker.jobs WHERE created_at >= to_timestamp(%(s)s + w * %(d)s) "
           "  AND created_at < to_timestamp(%(s)s + (w + 1) * %(d)s)), "
           " (SELECT count(*) FROM shardworker.jobs WHERE created_at < to_timestamp(%(s)s + (w + 1) * %(d)s) "
           "  AND created_at >= to_timestamp(%(s)s) AND (finished_at IS NULL "
           "       OR finished_at >= to_timestamp(%(s)s + (w + 1) * %(d)s))) "
           "FROM generate_series(0, %(n)s - 1) w ORDER BY w")
    with quiet_connect(dsn) as conn:
        rows = conn.execute(sql, {"s": start, "d": width, "n": len(samples)}).fetchall()
    out = []
    for (w, enqueued, done, p99, backlog), (dead, idx, pages) in zip(rows, samples, strict=True):
        lo = start + w * width
        ms = sorted(m for t, m in claims if lo <= t < lo + width)
        out.append(Window(w * width, enqueued / width, done / width, ms, None if p99 is None else float(p99) * 1000,
                          int(backlog), dead, idx, pages))
    return out


def load_history(conn: psycopg.Connection, n: int) -> None:
    """Empty the jobs table, fill it with ``n`` jobs done an hour ago, VACUUM ANALYZE: the
    planner sees a table in use, as in production (on a freshly emptied table it plans the
    claim for an empty one until autovacuum's first ANALYZE, a minute into the run)."""
    conn.execute("TRUNCATE shardworker.jobs CASCADE")  # and job_steps, job_dependencies
    conn.execute("INSERT INTO shardworker.jobs (kind, status, attempt, created_at, run_at, attempted_at, finished_at) "
                 "SELECT %s, 'done', 1, t, t, t, t FROM generate_series(1, %s) i, "
                 "LATERAL (SELECT now() - interval '1 hour' + i * interval '1 ms' AS t) a", (KIND, n))
    conn.execute("VACUUM ANALYZE shardworker.jobs")


def run(dsn: str, args: argparse.Namespace, work_dir: str) -> list[Window]:
    """Start the worker, warm it up, drive the load; the windows."""
    outbox_dir = tempfile.mkdtemp(prefix="sw-bench-outbox-", dir=work_dir)
    log = server_log(dsn, args.server_log)
    proc = start_worker(dsn, work_dir, outbox_dir, args.procs, Path(work_dir, "worker.log"))
    try:
        with quiet_connect(dsn) as conn:
            load_history(conn, args.history)
            wait_done(conn, [i for i in (enqueue(conn, KIND) for _ in range(50)) if i is not None], 60)
            offset = log.stat().st_size if log else 0
            start = float(conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0]) + 1  # type: ignore[index]
            samples = drive(dsn, args, start)
            wait_done(conn, [r[0] for r in conn.execute("SELECT id FROM shardworker.jobs").fetchall()], 300)
        return windows(dsn, start, 10 * args.minutes_scale, samples, claim_times(log, offset))
    finally:
        proc.send_signal(signal.SIGTERM)
        if proc.wait(60) != 0:
            tail = Path(work_dir, "worker.log").read_text(errors="replace").splitlines()[-15:]
            print(f"shardworker run exited {proc.returncode}:\n" + "\n".join(tail), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help="a scratch database (truncates shardworker.jobs); "
                                                    "default: a temporary embedded server")
    parser.add_argument("--server-log", default=None, help="the server's log file, with --dsn")
    parser.add_argument("--rate", type=float, default=800.0, help="jobs enqueued per second in all (default 800)")
    parser.add_argument("--writers", type=int, default=2, help="enqueuing processes (default 2)")
    parser.add_argument("--procs", type=int, default=2, help="shardworker run --procs (default 2)")
    parser.add_argument("--history", type=int, default=100_000,
                        help="done jobs in the table before the run (default 100,000)")
    parser.add_argument("--minutes-scale", type=float, default=1.0,
                        help="scale every duration (minutes, 10 s windows): 0.1 for an 18 s smoke run")
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.writers < 1 or args.minutes_scale <= 0 or args.history < 0:
        parser.error("--rate and --minutes-scale must be > 0, --writers >= 1, --history >= 0")
    os.environ["BENCH_SLEEP_MS"] = "0"
    print(f"code: {code_version()}; {args.rate:g} jobs/s from {args.writers} writers, --procs {args.procs}, "
          f"minutes x{args.minutes_scale:g}; horizon held in minute 2", flush=True)
    with database(args.dsn) as dsn, claim_logging(dsn) as logged:
        work_dir = tempfile.mkdtemp(prefix="sw-bench-horizon-")
        try:
            write_app(work_dir)
            result = run(dsn, args, work_dir)
        finally:
            shutil.rmtree(work_dir, ignore_errors=True)
    print_report(result, 10 * args.minutes_scale, 60 * args.minutes_scale, logged)
    return 0


if __name__ == "__main__":
    sys.exit(main())
