"""A child's death or timeout is charged to the job that caused it, never to its neighbours or
to the worker; and every handler has a timeout. Real worker processes on a real PostgreSQL;
handlers (``tests/apps/poison_app.py``) write every run to an fsync'd ledger first."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import enqueue, query, run_until_idle, runs, worker_log


def run_idle(dsn: str, dirs: tuple[Path, Path], *args: str, procs: int) -> int:
    return run_until_idle(dsn, dirs, *args, procs=procs, app="poison_app", timeout_s=55)


def row(dsn: str, job_id: int) -> tuple[str, int, str | None]:
    [found] = query(dsn, "SELECT status, attempt, last_error FROM shardworker.jobs WHERE id = %s", job_id)
    return found


def ledgers(count_dir: Path) -> list[list[int]]:
    """The job ids each process ran, in order, one list per process."""
    return [[int(line.split()[0]) for line in path.read_text().splitlines() if line.strip()]
            for path in count_dir.glob("runs-*.log")]


def assert_uncharged(dsn: str, count_dir: Path, ids: list[int]) -> int:
    """Each job is done with every attempt it had but the one it used (a run a neighbour's death
    cut short is snoozed: a new attempt that uses none of max_attempts), and ran at most once
    per attempt. Returns how many ran again."""
    rows = query(dsn, "SELECT id, status, max_attempts - (attempt - snoozes), last_error FROM shardworker.jobs "
                      "WHERE id = ANY(%s) ORDER BY id", ids)
    assert rows == [(i, "done", 24, None) for i in sorted(ids)], "a neighbour was charged an attempt"
    ran = runs(count_dir)
    assert all(ran[(i, 1)] == 1 for i in ids)
    assert not [key for key, n in ran.items() if key[0] in set(ids) and n != 1], "ran twice for one attempt"
    return sum(1 for i in ids if (i, 2) in ran)


def test_handlers_that_kill_their_child_fail_alone_and_the_worker_stays_up(
        pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """An os._exit(1) job and a segfaulting job among 200 sync jobs: each is charged with how its
    process died until its attempts are spent (a death after other handlers ran in that process
    is charged only once the job ran alone as a suspect: a run that uses no attempt); the worker
    keeps going and every other job runs once."""
    others = enqueue(pg_dsn, "ok", 200)
    [exiting] = enqueue(pg_dsn, "exit1", 1)
    [crashing] = enqueue(pg_dsn, "segv", 1)
    assert run_idle(pg_dsn, dirs, procs=2) == 0, worker_log(dirs[1])[-3000:]
    for job_id, error in ((exiting, "exit code 1"), (crashing, "signal 11 (SIGSEGV)")):
        status, attempt, snoozes, last_error = query(
            pg_dsn, "SELECT status, attempt, snoozes, last_error FROM shardworker.jobs WHERE id = %s", job_id)[0]
        assert (status, attempt - snoozes, last_error) == ("failed", 2, f"the handler's process died: {error}")
    ran = runs(dirs[1])
    poison = {k: n for k, n in ran.items() if k[0] in (exiting, crashing)}
    assert set(poison.values()) == {1} and 4 <= len(poison) <= 6, poison
    rows = query(pg_dsn, "SELECT id, status, attempt, last_error FROM shardworker.jobs WHERE id = ANY(%s)", others)
    assert [(status, error) for _, status, _, error in rows] == [("done", None)] * 200  # nobody charged
    assert all(n == 1 for n in ran.values()), "a handler ran twice for one attempt"
    # A neighbour runs again only when its handler had returned in a child that died before the
    # outcome was fsync'd: it is queued again with no attempt used (a snooze), so it ran under
    # attempt 1 in the ledger of a child a poison job killed, before that poison job's run.
    again = {i for i, _, attempt, _ in rows if attempt != 1}
    assert all(ran[(i, 2)] == 1 for i in again)
    before_a_death = {job_id for ledger in ledgers(dirs[1]) for at, job_id in enumerate(ledger)
                      if job_id in again and {exiting, crashing} & set(ledger[at:])}
    assert before_a_death == again
    assert "died 5 times" not in worker_log(dirs[1])


def test_threaded_neighbours_of_a_timed_out_job_are_not_charged(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """A threaded handler past its timeout_s gets its child killed: it alone is charged; the
    threaded jobs running beside it are snoozed (run again, nothing charged) and end done."""
    [hung] = enqueue(pg_dsn, "thread_hang", 1)
    neighbours = enqueue(pg_dsn, "thread_ok", 12, {"sleep": 3.0})
    assert run_idle(pg_dsn, dirs, "--concurrency", "13", procs=1) == 0, worker_log(dirs[1])[-3000:]
    assert row(pg_dsn, hung) == ("failed", 1, "timed out after 2s")
    assert runs(dirs[1])[(hung, 1)] == 1
    assert assert_uncharged(pg_dsn, dirs[1], neighbours) >= 1, "no neighbour was running at the kill"


def test_async_neighbours_of_a_job_that_kills_its_child_are_not_charged(
        pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """An async handler calls os._exit while its neighbours run on the same loop: nobody is known
    to be the cause, so they are all snoozed (nothing charged) and run again one at a time; the
    culprit dies alone and is charged until it fails."""
    [culprit] = enqueue(pg_dsn, "async_exit", 1, {"sleep": 0.5})
    neighbours = enqueue(pg_dsn, "async_ok", 8, {"sleep": 1.5})
    assert run_idle(pg_dsn, dirs, "--concurrency", "20", procs=1) == 0, worker_log(dirs[1])[-3000:]
    # Snoozed once among its neighbours (attempt 1, none of its handler's max_attempts=2 used),
    # then charged at attempts 2 and 3, the last its two attempts allow.
    assert row(pg_dsn, culprit) == ("failed", 3, "the handler's process died: exit code 1")
    assert {k: n for k, n in runs(dirs[1]).items() if k[0] == culprit} == {
        (culprit, 1): 1, (culprit, 2): 1, (culprit, 3): 1}
    assert assert_uncharged(pg_dsn, dirs[1], neighbours) >= 1, "no neighbour was running at the death"


def test_neighbours_of_an_async_handler_that_blocks_the_loop_are_not_charged(
        pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """An async handler that blocks the event loop cannot be cancelled: the parent kills the child
    after its timeout and grace; only it is charged."""
    [blocker] = enqueue(pg_dsn, "async_block", 1)
    neighbours = enqueue(pg_dsn, "async_ok", 6, {"sleep": 2.0})
    assert run_idle(pg_dsn, dirs, "--concurrency", "10", procs=1) == 0, worker_log(dirs[1])[-3000:]
    assert row(pg_dsn, blocker) == ("failed", 1, "timed out after 1s")
    assert assert_uncharged(pg_dsn, dirs[1], neighbours) >= 1, "no neighbour was running at the kill"
    # The log says why the kill came after the timeout and its grace (a user read "1s" and counted 11).
    assert "exceeded its 1s timeout and did not stop within 10s more" in worker_log(dirs[1])


def test_a_sync_handler_that_never_returns_is_ended_by_the_default_timeout(
        pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """With no timeout_s, --default-timeout 2s ends a handler that never returns and charges it;
    a kind's own timeout_s=60 overrides the default; everything else completes."""
    [stuck] = enqueue(pg_dsn, "forever", 1)
    [patient] = enqueue(pg_dsn, "patient", 1, {"sleep": 3.5})
    others = enqueue(pg_dsn, "ok", 30)
    assert run_idle(pg_dsn, dirs, "--default-timeout", "2s", procs=2) == 0, worker_log(dirs[1])[-3000:]
    assert row(pg_dsn, stuck) == ("failed", 1, "timed out after 2s")
    assert row(pg_dsn, patient) == ("done", 1, None)
    assert runs(dirs[1])[(patient, 1)] == 1
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE id = ANY(%s) AND status = 'done' "
                         "AND attempt = 1", others) == [(30,)]
