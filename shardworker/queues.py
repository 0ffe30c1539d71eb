"""Operating on queues without SQL: list them with their backlog, pause, resume, limit.

Each function takes an open psycopg connection (the caller's; used as ``enqueue`` uses it)
or a DSN string. A queue's state lives in ``shardworker.queues``, one row per queue an
operator set (created on first use; a queue without one runs unpaused and unlimited), and
holds across every worker on the database:

* ``pause``: no worker claims the queue's jobs; running ones finish. ``resume`` undoes it.
  Either keeps the limits.
* ``limit``: at most ``concurrency`` of its jobs running at once, and at most ``rate``
  (``"10/s"``, ``"600/m"``, ``"1000/h"``: see ``shardworker.core.flow``) starting per period. A
  limit given is set, one not given is kept; ``clear=True`` removes both.

Bad input (an empty or over-long name, a bad rate or concurrency, ``clear`` with a limit,
or nothing to set) raises ``ConfigError`` with one line saying what is accepted; nothing is
written.
"""

from __future__ import annotations

from typing import Any

from shardworker.core.flow import Rate, parse_rate
from shardworker.core.limits import MAX_JOB_KEY_BYTES, MAX_QUEUE_BYTES, not_storable_text, too_long
from shardworker.core.views import QueueInfo, QueueState
from shardworker.errors import ConfigError

__all__ = ["QueueInfo", "QueueState", "check_concurrency", "check_name", "limit", "list_queues", "pause", "resume"]

MAX_CONCURRENCY = 2**31 - 1  # the column is an int
MAX_WEIGHT = 1000  # a key's share of the turns: beyond that, give it a queue of its own


def list_queues(conn_or_dsn: Any) -> list[QueueInfo]:
    """Every queue with jobs queued or claimed, or a state row, by name: its state and backlog."""
    from shardworker.store import queue_queries

    return queue_queries.list_queues(conn_or_dsn)


def pause(conn_or_dsn: Any, name: str) -> QueueState:
    """Pause queue ``name``; its state after."""
    from shardworker.store import queue_queries

    return queue_queries.set_paused(conn_or_dsn, check_name(name), True)


def resume(conn_or_dsn: Any, name: str) -> QueueState:
    """Resume queue ``name``; its state after."""
    from shardworker.store import queue_queries

    return queue_queries.set_paused(conn_or_dsn, check_name(name), False)


def limit(conn_or_dsn: Any, name: str, *, concurrency: int | None = None, rate: str | Rate | None = None,
          clear: bool = False, key_concurrency: int | None = None,
          weights: dict[str, int] | None = None) -> QueueState:
    """Set queue ``name``'s limits across workers (the ones not given stay), or ``clear`` them
    all; its state after. ``key_concurrency``: at most this many jobs of one key (a tenant's)
    running at once in the queue, while other keys' jobs run. ``weights``: {key: W}, W of the
    key's jobs to each other key's one when keys take turns (merged into those set; 1 is the
    default)."""
    name = check_name(name)
    if clear and (concurrency is not None or rate is not None or key_concurrency is not None or weights):
        raise ConfigError("clear removes every limit: give it alone, or give the limits to set")
    if not clear and concurrency is None and rate is None and key_concurrency is None and not weights:
        raise ConfigError("give a concurrency, a key concurrency, a rate, or clear")
    for key, weight in (weights or {}).items():
        if not isinstance(key, str) or not key or len(key.encode()) > MAX_JOB_KEY_BYTES:
            raise ConfigError(f"weights: {key!r} is not a key (a non-empty string of at most {MAX_JOB_KEY_BYTES} bytes)")
        if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= MAX_WEIGHT:
            raise ConfigError(f"weights: {key}'s weight must be a whole number from 1 to {MAX_WEIGHT}, got {weight!r}")
    if concurrency is not None:
        concurrency = check_concurrency(concurrency)
    if key_concurrency is not None:
        key_concurrency = check_concurrency(key_concurrency)
    parsed = rate if rate is None or isinstance(rate, Rate) else parse_rate(rate)
    from shardworker.store import queue_queries

    return queue_queries.set_limits(conn_or_dsn, name, concurrency, parsed, clear, key_concurrency,
                                    dict(weights) if weights else None)


def check_name(name: Any) -> str:
    """``name`` when it can name a queue: a non-empty string of at most ``MAX_QUEUE_BYTES``
    bytes of UTF-8 that PostgreSQL text can hold; else ``ConfigError`` saying why."""
    if not isinstance(name, str):
        raise ConfigError(f"queue name must be a string, got {type(name).__name__}")
    if not name:
        raise ConfigError("queue name is empty")
    why = not_storable_text("queue name", name) or too_long("queue name", name, MAX_QUEUE_BYTES)
    if why:
        raise ConfigError(why)
    return name


def check_concurrency(value: Any) -> int:
    """``value`` when it is a whole number from 1 to ``MAX_CONCURRENCY``; else ``ConfigError``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONCURRENCY:
        raise ConfigError(f"concurrency must be a whole number from 1 to {MAX_CONCURRENCY:,}; got {value!r}")
    return value
