"""``shardworker jobs`` and ``shardworker.jobs`` on a real PostgreSQL: listing, showing,
retry, cancel and delete, all-or-nothing bulk changes, one-line errors, and races with a
running worker (a retried job runs once; a cancelled queued job never runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from shardworker import jobs
from shardworker.cli.main import main
from tests.helpers import (
    enqueue,
    execute,
    exit_code,
    query,
    runs,
    start_worker,
    status_counts,
    wait_for,
    worker_log,
)


def invoke(dsn: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["jobs", *args, "--dsn", dsn])


def assert_one_line_error(result: Result, *fragments: str) -> None:
    assert result.exit_code in (1, 2), result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert "Traceback" not in result.output
    assert any(all(f in line for f in fragments) for line in lines), result.output


def statuses(dsn: str) -> dict[int, str]:
    return dict(query(dsn, "SELECT id, status FROM shardworker.jobs"))


def test_list_leaves_the_error_of_an_earlier_attempt_off_a_done_job(pg_dsn: str) -> None:
    """A job done on its second attempt read "ValueError: boom" in the list's error column
    beside `done` (two new users took it for a failure). The table leaves it out for a done
    job; `--json` and `jobs show` keep it, with the job's errors history."""
    [done, failed] = enqueue(pg_dsn, "a", 2)
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'done', attempt = 2, last_error = 'ValueError: early' "
                    "WHERE id = %s", done)
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'failed', last_error = 'ValueError: late' WHERE id = %s",
            failed)
    lines = {int(line.split()[0]): line for line in invoke(pg_dsn, "list").output.splitlines()[1:]}
    assert "early" not in lines[done] and "late" in lines[failed]
    assert {j["id"]: j["last_error"] for j in json.loads(invoke(pg_dsn, "list", "--json").output)}[done] == \
        "ValueError: early"


def test_list_is_newest_first_with_filters_and_json(pg_dsn: str) -> None:
    a = enqueue(pg_dsn, "a", 3)
    b = enqueue(pg_dsn, "b", 2, queue="mail")
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'failed', last_error = 'boom' WHERE id = %s", a[0])
    listed = json.loads(invoke(pg_dsn, "list", "--json").output)
    assert [j["id"] for j in listed] == sorted(a + b, reverse=True)
    assert [j["id"] for j in json.loads(invoke(pg_dsn, "list", "--kind", "b", "--json").output)] == b[::-1]
    assert [j["id"] for j in json.loads(invoke(pg_dsn, "list", "--queue", "mail", "--json").output)] == b[::-1]
    failed = json.loads(invoke(pg_dsn, "list", "--status", "failed", "--json").output)
    assert [(j["id"], j["last_error"]) for j in failed] == [(a[0], "boom")]
    assert len(json.loads(invoke(pg_dsn, "list", "--limit", "2", "--json").output)) == 2
    assert json.loads(invoke(pg_dsn, "list", "--since", "1h", "--json").output)
    assert json.loads(invoke(pg_dsn, "list", "--since", "2999-01-01", "--json").output) == []
    text = invoke(pg_dsn, "list", "--status", "failed")
    assert text.exit_code == 0 and str(a[0]) in text.output and "boom" in text.output


def test_show_gives_the_whole_job(pg_dsn: str) -> None:
    [job_id] = enqueue(pg_dsn, "a", 1, {"x": [1, 2]})
    shown = json.loads(invoke(pg_dsn, "show", str(job_id), "--json").output)
    assert (shown["id"], shown["kind"], shown["payload"], shown["status"], shown["attempt"]) == (
        job_id, "a", {"x": [1, 2]}, "queued", 0)
    assert "created_at" in shown and "locked_by" in shown
    info = jobs.get_job(pg_dsn, job_id)
    assert info is not None and info.payload == {"x": [1, 2]}
    assert jobs.get_job(pg_dsn, job_id + 1000) is None


def test_retry_cancel_and_delete_change_what_they_may(pg_dsn: str) -> None:
    ids = enqueue(pg_dsn, "a", 4)
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'failed', attempt = max_attempts, "
                    "finished_at = now() WHERE id = %s", ids[0])
    assert json.loads(invoke(pg_dsn, "cancel", str(ids[1]), "--json").output) == {"cancel": 1}
    assert json.loads(invoke(pg_dsn, "retry", str(ids[0]), str(ids[1]), "--json").output) == {"retry": 2}
    rows = query(pg_dsn, "SELECT id, status, attempt < max_attempts, finished_at IS NULL "
                         "FROM shardworker.jobs WHERE id = ANY(%s) ORDER BY id", ids[:2])
    assert rows == [(ids[0], "queued", True, True), (ids[1], "queued", True, True)]
    assert invoke(pg_dsn, "delete", str(ids[2])).exit_code == 0
    assert ids[2] not in statuses(pg_dsn)


def test_retry_failed_in_bulk_by_kind_and_queue_with_a_count(pg_dsn: str) -> None:
    a = enqueue(pg_dsn, "a", 3)
    b = enqueue(pg_dsn, "b", 2)
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'failed'")
    result = invoke(pg_dsn, "retry", "--failed", "--kind", "a")
    assert result.exit_code == 0 and "3 jobs" in result.output
    assert {i: s for i, s in statuses(pg_dsn).items()} == {**{i: "queued" for i in a}, **{i: "failed" for i in b}}
    assert jobs.retry_failed(pg_dsn, queue="nowhere") == 0
    assert jobs.retry_failed(pg_dsn) == 2


@pytest.mark.parametrize(("args", "fragments"), [
    (["show", "999999"], ("no job 999999",)),
    (["cancel", "999999"], ("no job 999999", "nothing changed")),
    (["list", "--status", "finished"], ("finished",)),
    (["list", "--since", "yesterday"], ("--since", "yesterday")),
    (["retry"], ("job ids or --failed",)),
    (["retry", "1", "--kind", "a"], ("--failed",)),
    (["show", "abc"], ("abc",)),
])
def test_bad_input_is_one_line(pg_dsn: str, args: list[str], fragments: tuple[str, ...]) -> None:
    assert_one_line_error(invoke(pg_dsn, *args), *fragments)


def test_a_change_by_ids_acts_on_those_it_can_and_reports_the_others(pg_dsn: str) -> None:
    """A job that finished or was deleted meanwhile does not hold up the rest of the list: the
    others change, and the command says which it left and why (exit 0). Only a list that none
    of can change is refused, one line, nothing changed."""
    ids = enqueue(pg_dsn, "a", 4)
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'done' WHERE id = %s", ids[2])
    result = invoke(pg_dsn, "cancel", str(ids[0]), str(ids[1]), str(ids[2]), "424242")
    assert result.exit_code == 0, result.output
    assert result.stdout == "2 jobs cancelled\n"
    assert result.stderr == f"not cancelled (2): job {ids[2]}: it is done; job 424242: no such job\n"
    assert statuses(pg_dsn) == {ids[0]: "cancelled", ids[1]: "cancelled", ids[2]: "done", ids[3]: "queued"}
    deleted = invoke(pg_dsn, "delete", str(ids[0]), str(ids[3]), "424242", "--json")
    assert deleted.exit_code == 0 and json.loads(deleted.stdout) == {
        "delete": 2, "skipped": [{"id": 424242, "why": "no such job"}]}
    assert_one_line_error(invoke(pg_dsn, "cancel", str(ids[2])), f"cannot cancel job {ids[2]}", "done",
                          "nothing changed")
    assert_one_line_error(invoke(pg_dsn, "delete", "424242", "424243"), "cannot delete any of the 2 jobs",
                          "job 424242: no such job; job 424243: no such job", "nothing changed")
    assert statuses(pg_dsn) == {ids[1]: "cancelled", ids[2]: "done"}
    retried = jobs.retry(pg_dsn, [ids[1], ids[2]])
    assert retried == 1 and retried.skipped == ((ids[2], "it is done"),)
    with pytest.raises(jobs.JobsError, match="it is done"):
        jobs.retry(pg_dsn, [ids[2]])


def test_a_retry_that_cannot_run_its_job_says_so(pg_dsn: str) -> None:
    """A job cancelled because a job it waited on was cancelled, then that job deleted: it can
    never run again, and a retry of it is reported as such, never counted as done."""
    [first, other] = enqueue(pg_dsn, "a", 2)
    waiting = jobs_enqueue_after(pg_dsn, first)
    assert invoke(pg_dsn, "cancel", str(first), str(other)).exit_code == 0
    assert invoke(pg_dsn, "delete", str(first)).exit_code == 0
    assert statuses(pg_dsn) == {other: "cancelled", waiting: "cancelled"}
    assert_one_line_error(invoke(pg_dsn, "retry", str(waiting)), f"cannot retry job {waiting}",
                          "a job it waited on was deleted", "nothing changed")
    result = invoke(pg_dsn, "retry", str(waiting), str(other), "--json")
    assert result.exit_code == 0 and json.loads(result.stdout) == {
        "retry": 1, "skipped": [{"id": waiting, "why": "a job it waited on was deleted: it can never run"}]}
    assert statuses(pg_dsn) == {other: "queued", waiting: "cancelled"}


def jobs_enqueue_after(dsn: str, job_id: int) -> int:
    from shardworker import enqueue as enqueue_one

    found = enqueue_one(dsn, "b", after=[job_id])
    assert found is not None
    return found


def test_a_running_job_can_be_cancelled_but_not_deleted(pg_dsn: str) -> None:
    """Cancel takes a running job (its worker stops the handler: tests/worker/test_cancel_running.py);
    delete refuses it."""
    [job_id, other] = enqueue(pg_dsn, "a", 2)
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'running', attempt = 1 WHERE id IN (%s, %s)",
            job_id, other)
    assert_one_line_error(invoke(pg_dsn, "delete", str(job_id)), "it is running")
    assert invoke(pg_dsn, "cancel", str(job_id)).exit_code == 0
    assert statuses(pg_dsn) == {job_id: "cancelled", other: "running"}


def test_the_commands_work_from_a_real_subprocess(pg_dsn: str) -> None:
    [job_id] = enqueue(pg_dsn, "a", 1)
    out = subprocess.run([sys.executable, "-m", "shardworker", "jobs", "cancel", str(job_id), "--json",
                          "--dsn", pg_dsn], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and json.loads(out.stdout) == {"cancel": 1}, out.stderr
    again = subprocess.run([sys.executable, "-m", "shardworker", "jobs", "cancel", str(job_id), "--dsn", pg_dsn],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and again.stderr.count("\n") == 1 and "cancelled" in again.stderr


def test_a_reader_that_leaves_early_ends_the_listing_quietly(pg_dsn: str) -> None:
    """``jobs list | head -1``: the listing stops at the closed pipe, with no error and no traceback."""
    enqueue(pg_dsn, "a", 3000)
    lister = subprocess.Popen([sys.executable, "-m", "shardworker", "jobs", "list", "--limit", "3000",
                               "--dsn", pg_dsn], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert lister.stdout is not None and lister.stderr is not None
    assert lister.stdout.readline().split()[:2] == [b"id", b"status"]  # the header
    assert lister.stdout.readline().split()[1] == b"queued"
    lister.stdout.close()
    assert lister.wait(60) == 141
    assert lister.stderr.read() == b""


def test_an_empty_listing_says_so(pg_dsn: str) -> None:
    result = invoke(pg_dsn, "list", "--status", "failed")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "no jobs match\n")


def test_with_a_worker_running_a_cancelled_job_never_runs_and_a_retried_one_runs_once(
        pg_dsn: str, tmp_path: Path) -> None:
    outbox_dir, counts = tmp_path / "outbox", tmp_path / "counts"
    counts.mkdir()
    [failing] = enqueue(pg_dsn, "fail", 1)  # fails 3 times, then for good
    later = enqueue(pg_dsn, "count", 5, run_at=datetime.now(UTC) + timedelta(seconds=3))  # not due yet
    proc = start_worker(pg_dsn, outbox_dir, counts, procs=2)
    try:
        assert jobs.cancel(pg_dsn, later[:3]) == 3
        wait_for(lambda: statuses(pg_dsn).get(failing) == "failed", 30, "the failing job failed for good")
        assert jobs.retry(pg_dsn, [failing]) == 1
        wait_for(lambda: status_counts(pg_dsn).get("done", 0) == 2 and statuses(pg_dsn).get(failing) == "failed"
                 and query(pg_dsn, "SELECT attempt FROM shardworker.jobs WHERE id = %s", failing)[0][0] == 4,
                 30, "the retried attempt and the uncancelled jobs finished")
    finally:
        proc.terminate()
        assert exit_code(proc, 60, counts) == 0, worker_log(counts)
    ran = runs(counts)
    assert not any(job in later[:3] for job, _ in ran), "a cancelled job ran"
    assert {a for j, a in ran if j == failing} == {1, 2, 3, 4} and all(n == 1 for n in ran.values())
    assert {i: statuses(pg_dsn)[i] for i in later} == {**{i: "cancelled" for i in later[:3]},
                                                        **{i: "done" for i in later[3:]}}
