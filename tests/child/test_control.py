"""Handler control: ``Retry``, ``Snooze``, ``Fail`` and ``Cancel`` through a real worker, and
the outcome record that carries them."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardworker import Cancel, Fail, Retry, Snooze
from shardworker.app import App
from shardworker.child.handlers import run_sync
from shardworker.core import wire
from shardworker.core.model import ClaimedJob, Disposition, Outcome
from shardworker.errors import ConfigError
from tests.helpers import enqueue, exit_code, query, runs, start_worker

RETRY = Disposition.RETRY


def test_control_outcomes_survive_the_outbox_record() -> None:
    for outcome in (Outcome.snoozed(1, 2, 3.5), Outcome.cancelled(1, 2, "withdrawn"), Outcome.failed(1, 2, "y"),
                    Outcome.done(1, 2, b"[1]"), Outcome.retry(1, 2, "x", 1.0)):
        assert wire.decode_outcome(wire.encode_outcome(outcome)) == outcome


def test_each_exception_becomes_its_outcome() -> None:
    app = App()
    raised = {"retry": Retry("busy", delay_s=7), "snooze": Snooze(delay_s=9), "fail": Fail("never"),
              "cancel": Cancel("withdrawn")}
    for kind, exc in raised.items():
        def handler(job: object, exc: Exception = exc) -> None:
            raise exc
        app.handler(kind)(handler)
    out = {kind: run_sync(app, ClaimedJob(1, kind, "default", "null", 1, 25)) for kind in raised}
    assert (out["retry"].disposition, out["retry"].delay_s, out["retry"].error) == (RETRY, 7.0, "Retry: busy")
    assert (out["snooze"].disposition, out["snooze"].delay_s) == (Disposition.SNOOZED, 9.0)
    assert (out["fail"].disposition, out["fail"].error) == (Disposition.FAILED, "Fail: never")
    assert (out["cancel"].disposition, out["cancel"].error) == (Disposition.CANCELLED, "withdrawn")


@pytest.mark.parametrize("bad", [-1, float("nan"), "soon"])
def test_a_bad_delay_is_refused_in_one_line(bad: object) -> None:
    with pytest.raises(ConfigError, match="delay_s"):
        Snooze(delay_s=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="delay_s"):
        Retry(delay_s=bad)  # type: ignore[arg-type]


def test_a_worker_obeys_each_control(pg_dsn: str, tmp_path: Path) -> None:
    count_dir, outbox_dir = tmp_path / "count", tmp_path / "outbox"
    count_dir.mkdir()
    kinds = ["retry_twice", "retry_always", "snooze_once", "snooze_async", "fail_now", "cancel_me"]
    ids = {kind: enqueue(pg_dsn, kind, 2) for kind in kinds}
    proc = start_worker(pg_dsn, outbox_dir, count_dir, "--exit-when-idle", procs=2)
    assert exit_code(proc, 60, count_dir) == 0

    rows = {r[0]: r[1:] for r in query(pg_dsn, "SELECT id, status, attempt, max_attempts, result, last_error, "
                                               "finished_at IS NOT NULL FROM shardworker.jobs")}
    ran = runs(count_dir)
    assert all(n == 1 for n in ran.values()), f"an attempt ran twice: {ran}"

    def final(kind: str) -> set[tuple[object, ...]]:
        return {rows[i] for i in ids[kind]}

    # Retry uses attempts: the third one succeeds; with the handler's max_attempts=3 it fails
    # after 3, and the row says 3 of 3 (not 3 of the job's 25).
    assert final("retry_twice") == {("done", 3, 25, 3, "Retry: not yet", True)}
    assert final("retry_always") == {("failed", 3, 3, None, "Retry: retry requested", True)}
    # Snooze uses none: two runs, max_attempts untouched, the first counted as a snooze.
    assert final("snooze_once") == {("done", 2, 25, 2, None, True)}
    assert final("snooze_async") == {("done", 2, 25, 2, None, True)}
    assert {s for (s,) in query(pg_dsn, "SELECT DISTINCT snoozes FROM shardworker.jobs WHERE kind LIKE 'snooze%'")} \
        == {1}
    # Fail ends the job at once, attempts left or not; Cancel marks it cancelled.
    assert final("fail_now") == {("failed", 1, 1, None, "Fail: card declined", True)}
    assert final("cancel_me") == {("cancelled", 1, 25, None, "order withdrawn", True)}
    assert sum(ran.values()) == 2 * (3 + 3 + 2 + 2 + 1 + 1)
