"""The heartbeat row of a worker id belongs to one process: a process takes it over on its
first beat only, later beats leave another process's row alone and say whose it is, and a
clean stop removes only the row it wrote. Real PostgreSQL."""

from __future__ import annotations

import os

import pytest

from shardworker.core import procs
from shardworker.core.retry import Backoff
from shardworker.errors import WorkerRescued
from shardworker.store.pg_store import PgStore
from shardworker.worker.heartbeat import Heartbeat
from tests.clocks import FakeClock
from tests.helpers import execute, query


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


def test_an_id_beating_elsewhere_is_refused_while_a_silent_one_is_taken_over(store: PgStore, other: PgStore,
                                                                             pg_dsn: str) -> None:
    """check_worker_id watches another host's row: refused (naming host and pid) when its heartbeat
    advances, returned when it stays silent for the whole watch."""
    import pytest

    from shardworker.errors import WorkerIdInUse
    from shardworker.worker.identity import WATCH_BEATS, check_worker_id

    other.heartbeat("w", "elsewhere.invalid", 7)
    clock = FakeClock(0.0)

    def beat_while_watched(seconds: float) -> None:
        clock.sleep(seconds)
        execute(pg_dsn, "UPDATE shardworker.workers SET heartbeat_at = heartbeat_at + interval '2 s'")

    with pytest.raises(WorkerIdInUse, match=r"elsewhere\.invalid \(pid 7\).*own --worker-id"):
        check_worker_id(store, "w", 2.0, sleep=beat_while_watched, clock=clock)
    clock = FakeClock(0.0)
    check_worker_id(store, "w", 2.0, sleep=clock.sleep, clock=clock)
    assert clock.now >= WATCH_BEATS * 2.0 and clock.sleeps > 1


def test_a_dead_or_unreaped_pid_on_this_host_is_taken_over_at_once(store: PgStore) -> None:
    """A row of this host whose process exited (even one not reaped yet) is a crashed predecessor."""
    import socket
    import subprocess
    import sys

    from shardworker.worker.identity import check_worker_id

    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    while exited.poll() is None and not _is_zombie(exited.pid):
        pass
    for pid in (exited.pid, 2 ** 22 + 1):  # unreaped, then one above Linux's pid_max: never alive
        store.heartbeat("w", socket.gethostname(), pid)
        clock = FakeClock(0.0)
        check_worker_id(store, "w", 2.0, sleep=clock.sleep, clock=clock)
        assert clock.sleeps == 0
    exited.wait()


def _is_zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] == b"Z"


@pytest.mark.parametrize("rescue_after_s", [60.0, None])  # a worker's heartbeat, and a drain's
def test_a_heartbeat_that_finds_its_row_gone_stops_its_worker_and_closes_the_gate(
        store: PgStore, pg_dsn: str, rescue_after_s: float | None) -> None:
    """The first beat inserts the row; a later beat that has to insert it again finds it was
    rescued: ``WorkerRescued`` in ``conflict``, and the children's gate closed (0). A drain's
    heartbeat (no rescue window) says so too, without failing on its missing window."""
    alive: list[float] = []
    beat = Heartbeat(store, "w", interval_s=1.0, rescue_after_s=rescue_after_s, backoff=Backoff(0.05, 1.0),
                     on_alive=lambda boot, wall: alive.append(boot))
    beat.run_once(0.0)
    assert beat.conflict is None and store.worker_row("w") is not None
    assert alive == ([] if rescue_after_s is None else [pytest.approx(procs.boottime() + 60, abs=5)])
    row = store.worker_row("w")
    assert row is not None
    assert store.rescue_workers([("w", row.heartbeat_at)]).workers == ("w",)  # a peer's rescue
    beat.run_once(5.0)
    assert isinstance(beat.conflict, WorkerRescued), beat.conflict
    assert "rescued the jobs of worker 'w'" in str(beat.conflict)
    assert alive[-1] == 0.0


def test_a_heartbeat_row_the_database_lost_is_written_again_and_the_worker_goes_on(
        store: PgStore, pg_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """The row is gone and no rescue left a tombstone of it: the database went back in time (a
    failover to a replica that lagged, a restore, to before the worker's first beat). The beat
    writes it again, the worker goes on, and its children may start jobs."""
    alive: list[float] = []
    beat = Heartbeat(store, "w", interval_s=1.0, rescue_after_s=60.0, backoff=Backoff(0.05, 1.0),
                     on_alive=lambda boot, wall: alive.append(boot))
    beat.run_once(0.0)
    assert beat.server  # the server the beat reached, for the worker to notice a new one
    query(pg_dsn, "DELETE FROM shardworker.workers WHERE worker_id = 'w' RETURNING 1")  # the database went back
    beat.server = "the server before the failover"
    with caplog.at_level("WARNING"):
        beat.run_once(5.0)
    assert beat.conflict is None
    assert store.worker_row("w") is not None and alive[-1] > 0
    assert "database went back in time" in caplog.text


def test_a_row_gone_on_the_same_server_without_a_tombstone_is_a_rescue(store: PgStore, pg_dsn: str) -> None:
    """No tombstone, but the server is the one of the last beat: the database did not go back,
    so a rescue removed the row (a peer of a release before tombstones): the worker stops."""
    beat = Heartbeat(store, "w", interval_s=1.0, rescue_after_s=60.0, backoff=Backoff(0.05, 1.0))
    beat.run_once(0.0)
    query(pg_dsn, "DELETE FROM shardworker.workers WHERE worker_id = 'w' RETURNING 1")
    beat.run_once(5.0)
    assert isinstance(beat.conflict, WorkerRescued), beat.conflict


def test_a_row_the_database_went_back_to_names_a_gone_process_of_this_host_and_is_taken_over(
        store: PgStore, pg_dsn: str) -> None:
    """The database went back to before this worker started: its row names the worker's earlier
    run on this host, whose process is gone. The beat takes it over instead of stopping as for a
    second live worker under the id."""
    import socket
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    beat = Heartbeat(store, "w", interval_s=1.0, rescue_after_s=60.0, backoff=Backoff(0.05, 1.0))
    beat.run_once(0.0)
    query(pg_dsn, "UPDATE shardworker.workers SET hostname = %s, pid = %s WHERE worker_id = 'w' RETURNING 1",
          socket.gethostname(), int(gone.stdout))
    beat.server = "the server before the failover"
    beat.run_once(5.0)
    assert beat.conflict is None
    row = store.worker_row("w")
    assert row is not None and row.pid == os.getpid()
