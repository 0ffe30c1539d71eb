"""What a NOTIFY costs concurrent committers: ``--clients`` processes each commit one-row
INSERTs on their own autocommit connection for ``--seconds``, with a ``pg_notify`` in the same
statement (as ``enqueue`` does) and without, in interleaved rounds; it prints commits/s.

PostgreSQL serializes the commits of notifying transactions: each takes one lock on the
notification queue before its commit record is flushed and holds it to the end, so their WAL
flushes cannot be grouped. The rate with NOTIFY is about one commit per flush, whatever
the number of clients; without it, concurrent commits share flushes. This bounds how fast
single enqueues (and the flusher's applies, which announce finished jobs) can commit on a
given disk, and what they wait for under load (bench/latency.py --clients).

    python bench/notify_lock.py                     # a temporary embedded server
    python bench/notify_lock.py --clients 4 --seconds 5 --rounds 2 --dsn postgresql://...
"""

from __future__ import annotations

import argparse
import multiprocessing
import time

import psycopg
from bench_db import database

NOTIFYING = ("WITH i AS (INSERT INTO bench_notify_lock(v) VALUES (1) RETURNING id) "
             "SELECT pg_notify('bench_notify_lock', '') FROM i")
PLAIN = "INSERT INTO bench_notify_lock(v) VALUES (1)"


def client(dsn: str, statement: str, seconds: float, counts: multiprocessing.Queue[int]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        done, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            conn.execute(statement)
            done += 1
    counts.put(done)


def rate(dsn: str, statement: str, clients: int, seconds: float) -> float:
    """Commits per second of ``clients`` processes running ``statement`` for ``seconds``."""
    ctx = multiprocessing.get_context("fork")
    counts: multiprocessing.Queue[int] = ctx.Queue()
    procs = [ctx.Process(target=client, args=(dsn, statement, seconds, counts)) for _ in range(clients)]
    for p in procs:
        p.start()
    total = sum(counts.get() for _ in procs)
    for p in procs:
        p.join()
    return total / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", help="a scratch database (default: a temporary embedded server)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with database(args.dsn) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS bench_notify_lock (id bigserial PRIMARY KEY, v int)")
        try:
            for _ in range(args.rounds):
                for name, statement in (("with NOTIFY", NOTIFYING), ("without", PLAIN)):
                    print(f"{args.clients} clients, {name}: {rate(dsn, statement, args.clients, args.seconds):,.0f} "
                          "commits/s", flush=True)
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("DROP TABLE bench_notify_lock")


if __name__ == "__main__":
    main()
