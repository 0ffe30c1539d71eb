"""Many writers enqueuing single jobs, with and without NOTIFY, for bench/fleet.py.

Each of ``--writers`` processes opens its own autocommit connection and calls
``shardworker.enqueue(conn, kind)`` (what an application does per request) as fast as it
can for ``--seconds``; a listener connection in the bench LISTENs on ``shardworker_jobs``
and drains what arrives, as an idle worker would. Three variants, in alternating rounds:

* *NOTIFY after the commit* (as shipped): the INSERT commits, then the NOTIFY in a
  transaction of its own;
* *NOTIFY in the insert's transaction*: the same call inside ``conn.transaction()``, so both
  commit together (what every enqueue did before, and still does in a caller's transaction);
* *without NOTIFY*: the ``notify_queue`` statement replaced by ``SELECT 1`` in the writer
  processes: the same round trips, no notification.

The table gives each one's median enqueues/s and its ratio to the last.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import statistics
import threading
import time

import psycopg

from shardworker import enqueue
from shardworker.store.sql import queries

KIND = "bench_fleet_enqueue"  # no worker runs it: the rows only pile up
# name: (notify_queue replaced by, each enqueue in a transaction of its own)
VARIANTS = {"NOTIFY after the commit (shipped)": (None, False),
            "NOTIFY in the insert's transaction": (None, True),
            "without NOTIFY": ("SELECT 1", False)}
BASE = "without NOTIFY"


def writer(dsn: str, variant: tuple[str | None, bool], start: float, stop: float,
           results: multiprocessing.Queue) -> None:
    """Enqueue single jobs from ``start`` to ``stop`` (epoch seconds); report how many."""
    replace, in_transaction = variant
    if replace is not None:
        queries()["notify_queue"] = replace
    done = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue(conn, KIND)  # connection and statement warm
        time.sleep(max(0.0, start - time.time()))
        while time.time() < stop:
            with conn.transaction() if in_transaction else contextlib.nullcontext():
                enqueue(conn, KIND)
            done += 1
    results.put(done)


def listen(dsn: str, stop: threading.Event, got: list[int]) -> None:
    """Drain shardworker_jobs notifications until ``stop``; count them in ``got[0]``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("LISTEN shardworker_jobs")
        while not stop.is_set():
            got[0] += sum(1 for _ in conn.notifies(timeout=0.2))


def one_round(dsn: str, variant: tuple[str | None, bool], writers: int, seconds: float) -> tuple[float, int]:
    """Enqueues/s of ``writers`` processes over ``seconds``, and notifications received."""
    stop_listening, got = threading.Event(), [0]
    listener = threading.Thread(target=listen, args=(dsn, stop_listening, got), daemon=True)
    listener.start()
    results: multiprocessing.Queue = multiprocessing.Queue()
    start = time.time() + 1.5  # every writer connected and warm before it
    procs = [multiprocessing.Process(target=writer, args=(dsn, variant, start, start + seconds, results))
             for _ in range(writers)]
    for p in procs:
        p.start()
    total = sum(results.get(timeout=seconds + 60) for _ in procs)
    for p in procs:
        p.join()
    time.sleep(0.5)
    stop_listening.set()
    listener.join()
    return total / seconds, got[0]


def compare_enqueue(dsn: str, args: argparse.Namespace) -> None:
    """Interleaved rounds of each variant; the medians side by side."""
    rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for r in range(args.repeat):
        for name, variant in VARIANTS.items():
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("DELETE FROM shardworker.jobs WHERE kind = %s", (KIND,))
                conn.execute("VACUUM shardworker.jobs")
            rate, notified = one_round(dsn, variant, args.writers, args.seconds)
            rates[name].append(rate)
            print(f"round {r + 1}: {name}: {rate:,.0f} enqueues/s, {notified:,} notifications received", flush=True)
    base = statistics.median(rates[BASE])
    print(f"\n{args.writers} writers, single-row enqueue on autocommit connections, medians of {args.repeat}:")
    print("| variant | enqueues/s | vs without NOTIFY |\n|---|---:|---:|")
    for name, values in rates.items():
        rate = statistics.median(values)
        print(f"| {name} | {rate:,.0f} | {rate / base:.2f} |")
