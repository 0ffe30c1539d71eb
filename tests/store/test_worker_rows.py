"""The heartbeat row of a worker id belongs to one process: a process takes it over on its
first beat only, later beats leave another process's row alone and say whose it is, and a
clean stop removes only the row it wrote. Real PostgreSQL."""

from __future__ import annotations

from shardworker.pg_store import PgStore
from tests.helpers import query


def test_a_later_beat_leaves_another_process_row_alone_and_names_it(store: PgStore, other: PgStore,
                                                                    pg_dsn: str) -> None:
    """After a take-over by (host-b, 2), a beat of (host-a, 1) without take_over writes nothing
    and returns (host-b, 2); with take_over it writes."""
    assert store.heartbeat("w", "host-a", 1) is None
    assert store.heartbeat("w", "host-a", 1, take_over=False) is None  # its own row
    assert other.heartbeat("w", "host-b", 2, take_over=True) is None
    assert store.heartbeat("w", "host-a", 1, take_over=False) == ("host-b", 2)
    assert query(pg_dsn, "SELECT hostname, pid FROM shardworker.workers WHERE worker_id = 'w'") == [("host-b", 2)]
    row = store.worker_row("w")
    assert row is not None and row[:2] == ("host-b", 2)
    assert store.worker_row("nobody") is None


def test_a_beat_after_a_rescue_removed_the_row_writes_it_again(store: PgStore, pg_dsn: str) -> None:
    """A row deleted (a rescue, a clean stop) is simply written again: no other process holds it."""
    assert store.heartbeat("w", "host-a", 1) is None
    query(pg_dsn, "DELETE FROM shardworker.workers WHERE worker_id = 'w' RETURNING 1")
    assert store.heartbeat("w", "host-a", 1, take_over=False) is None
    assert store.worker_row("w") is not None


def test_forget_removes_only_the_row_this_process_wrote(store: PgStore, pg_dsn: str) -> None:
    """A stopping worker whose id another live process took over leaves that process's row."""
    store.heartbeat("w", "host-b", 2)
    store.forget_worker("w", "host-a", 1)
    assert query(pg_dsn, "SELECT hostname, pid FROM shardworker.workers") == [("host-b", 2)]
    store.forget_worker("w", "host-b", 2)
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.workers") == [(0,)]
