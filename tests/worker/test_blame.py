"""Who is charged when a child ends (``shardworker.worker.blame``), and the default handler timeout
(``App.with_default_timeout``, ``WorkerConfig.default_timeout_s``). Pure logic: no processes."""

from __future__ import annotations

import signal

import pytest

from shardworker.app import App
from shardworker.core.config import WorkerConfig
from shardworker.core.model import ClaimedJob, Job
from shardworker.errors import ConfigError
from shardworker.worker.blame import SHUTDOWN_TIMEOUT, Cause, judge, process_death


def job(job_id: int) -> ClaimedJob:
    return ClaimedJob(job_id, "k", "default", "null", 1, 5)


A, B, C, D = job(1), job(2), job(3), job(4)


def test_a_timeout_charges_the_late_jobs_and_snoozes_the_others() -> None:
    """Killed for a timeout: the late job gets its timeout as error; other running and returned
    jobs are snoozed (a new attempt, none used up; never the same attempt twice); the death is
    not a crash."""
    verdict = judge(Cause(killed=True, timed_out={(1, 1): "timed out after 5s"}), [A, B], [C])
    assert verdict.charged == ((A, "timed out after 5s"),)
    assert (verdict.snooze, verdict.suspects, verdict.crash) == ((B, C), (), False)


def test_a_kill_at_the_shutdown_timeout_says_so_not_a_handler_timeout() -> None:
    """A stop's --shutdown-timeout passed with a handler running: the log line says that, not
    "killed for a timeout" (a new user looked for a handler's timeout_s)."""
    verdict = judge(Cause(killed=True, timed_out={(1, 1): SHUTDOWN_TIMEOUT}), [A], [])
    assert verdict.charged == ((A, "shutdown timeout"),)
    assert verdict.reason == "killed: still running at the end of --shutdown-timeout"


def test_a_death_with_one_running_job_charges_it_with_how_the_process_died() -> None:
    verdict = judge(Cause(exitcode=-signal.SIGSEGV), [A], [B])
    assert verdict.charged == ((A, "the handler's process died: signal 11 (SIGSEGV)"),)
    assert (verdict.snooze, verdict.suspects, verdict.crash) == ((B,), (), False)
    assert judge(Cause(exitcode=1), [A], []).charged == ((A, "the handler's process died: exit code 1"),)


def test_a_death_with_several_running_jobs_makes_them_suspects() -> None:
    """Nobody is known to be the cause: nobody is charged, all are snoozed, and the running ones
    run alone when claimed again."""
    verdict = judge(Cause(exitcode=-signal.SIGKILL), [A, B, C], [D])
    assert (verdict.charged, verdict.suspects, verdict.snooze, verdict.crash) == ((), (A, B, C), (A, B, C, D), False)


def test_a_death_with_no_running_job_counts_toward_the_crash_loop() -> None:
    verdict = judge(Cause(exitcode=1), [], [A])
    assert (verdict.charged, verdict.suspects, verdict.snooze, verdict.crash) == ((), (), (A,), True)
    assert verdict.reason == "worker process died: exit code 1"


def test_a_fatal_report_charges_what_it_held_and_counts_as_a_crash() -> None:
    """The outbox cannot take outcomes: every started job without one fails with that error, as before."""
    verdict = judge(Cause(fatal="OutboxSyncError: EIO", exitcode=3), [A], [B])
    assert verdict.charged == ((A, "OutboxSyncError: EIO"), (B, "OutboxSyncError: EIO")) and verdict.crash


def test_process_death_names_signals_and_exit_codes() -> None:
    assert process_death(-9) == "signal 9 (SIGKILL)"
    assert process_death(2) == "exit code 2"
    assert process_death(-200) == "signal 200"
    assert process_death(None) == "unknown exit status"


def test_the_default_timeout_applies_only_to_handlers_without_their_own() -> None:
    app = App()

    @app.handler("plain")
    def plain(job: Job) -> None: ...

    @app.handler("own", timeout_s=60)
    def own(job: Job) -> None: ...

    timed = app.with_default_timeout(2.0)
    assert (timed.handlers["plain"].timeout_s, timed.handlers["own"].timeout_s) == (2.0, 60)
    assert app.handlers["plain"].timeout_s is None  # the app itself is unchanged
    assert app.with_default_timeout(0) is app


def test_the_default_timeout_is_thirty_minutes_and_validated() -> None:
    assert WorkerConfig(dsn="x", app_ref="m").default_timeout_s == 1800.0
    with pytest.raises(ConfigError, match="default_timeout_s"):
        WorkerConfig(dsn="x", app_ref="m", default_timeout_s=-1)


def test_one_running_job_after_other_handlers_ran_in_the_process_is_a_suspect_not_charged() -> None:
    """Another handler ran in that process before (it may have left a thread or a timer that
    killed it): the one running job is snoozed as a suspect; run alone, a death charges it."""
    verdict = judge(Cause(exitcode=3), [B], [], others_ran=True)
    assert (verdict.charged, verdict.snooze, verdict.suspects) == ((), (B,), (B,))
    alone = judge(Cause(exitcode=3), [B], [], others_ran=True, alone=True)
    assert alone.charged == ((B, "the handler's process died: exit code 3"),)
