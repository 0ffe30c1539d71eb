"""What live workers serve, on a real PostgreSQL: a heartbeat row names its kinds, queues and
rescue window; queued kinds no live worker serves are listed with their count and oldest;
``refuse_unserved`` refuses them. A worker past its rescue window, a drain's row and a
worker of other queues serve nothing here."""

from __future__ import annotations

import pytest

from shardworker.core.views import Serving
from shardworker.errors import KindNotServed
from shardworker.store.pg_store import PgStore
from shardworker.store.serving import refuse_unserved
from tests.helpers import enqueue, execute, query


def unserved(store: PgStore, *also: str) -> dict[tuple[str, str], int]:
    return {(row.queue, row.kind): row.queued for row in store.unserved_kinds(list(also))}


def test_a_beat_says_what_the_worker_serves(store: PgStore, pg_dsn: str) -> None:
    """The row holds the kinds, the queues (NULL: every queue) and the rescue window; a drain's
    beat (nothing served) clears them."""
    store.heartbeat("w", "host", 1, serves=Serving(("a", "b"), ("mail",), 60.0))
    assert query(pg_dsn, "SELECT kinds, queues, rescue_after_s FROM shardworker.workers") == [
        (["a", "b"], ["mail"], 60.0)]
    store.heartbeat("w", "host", 1)
    assert query(pg_dsn, "SELECT kinds, queues, rescue_after_s FROM shardworker.workers") == [(None, None, None)]


def test_queued_kinds_no_live_worker_serves_are_listed_most_first(store: PgStore, pg_dsn: str) -> None:
    """Counts by queue and kind, most first, with the oldest run_at and how long ago it fell
    due; a kind served in one queue is still unserved in another; only queued jobs count."""
    enqueue(pg_dsn, "send", 2, queue="mail")
    enqueue(pg_dsn, "send", 1, queue="bulk")
    enqueue(pg_dsn, "cuont", 3)
    execute(pg_dsn, "UPDATE shardworker.jobs SET run_at = now() - interval '10 minutes' WHERE kind = 'cuont'")
    store.heartbeat("w", "host", 1, serves=Serving(("send",), ("mail",), 3600.0))
    rows = store.unserved_kinds()
    assert [(r.queue, r.kind, r.queued) for r in rows] == [("default", "cuont", 3), ("bulk", "send", 1)]
    assert 590 < rows[0].waiting_s < 700 and rows[0].oldest_run_at is not None
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'done' WHERE kind = 'cuont'")
    assert unserved(store) == {("bulk", "send"): 1}


def test_a_worker_past_its_rescue_window_or_a_drain_serves_nothing(store: PgStore, pg_dsn: str) -> None:
    """Live is a heartbeat within the row's own rescue window, by the database's clock."""
    enqueue(pg_dsn, "k", 2)
    store.heartbeat("w1", "host", 1, serves=Serving(("k",), None, 30.0))
    assert unserved(store) == {}
    execute(pg_dsn, "UPDATE shardworker.workers SET heartbeat_at = now() - interval '31 seconds'")
    assert unserved(store) == {("default", "k"): 2}
    store.heartbeat("w2", "host", 2)  # a drain beating: serves nothing
    assert unserved(store) == {("default", "k"): 2}
    store.heartbeat("w3", "host", 3, serves=Serving(("k",), None, 3600.0))
    assert unserved(store) == {}


def test_the_askers_own_kinds_count_as_served(store: PgStore, pg_dsn: str) -> None:
    """A worker asking before its first beat landed does not name its own kinds."""
    enqueue(pg_dsn, "mine", 1)
    enqueue(pg_dsn, "theirs", 1)
    assert unserved(store, "mine") == {("default", "theirs"): 1}
    assert [r.kind for r in store.unserved_kinds(["mine"], ["elsewhere"])] == ["mine", "theirs"]


def test_refuse_unserved_names_each_pair_and_passes_served_ones(store: PgStore, pg_dsn: str) -> None:
    store.heartbeat("w", "host", 1, serves=Serving(("send",), ("mail",), 3600.0))
    refuse_unserved(pg_dsn, [("mail", "send"), ("mail", "send")])
    with pytest.raises(KindNotServed) as caught:
        refuse_unserved(pg_dsn, [("mail", "send"), ("default", "send"), ("mail", "sned")])
    message = str(caught.value)
    assert "'send' in queue 'default'" in message and "'sned' in queue 'mail'" in message
    assert "'send' in queue 'mail'" not in message and "\n" not in message
