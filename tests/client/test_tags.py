"""Tags and bulk actions: tags on every enqueue path (one job and many, sync and async, COPY and
after=, debounce, a handler's follow-up, the command line and its --file, SQL), found by
`jobs list --tag` and `--error-contains`, and the bulk `jobs retry|cancel|delete` by the same
filters, counted first with --dry-run, on real workers and their failed jobs."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

import shardworker
from shardworker import JobSpec, jobs
from shardworker.errors import EnqueueError, JobsError
from tests.helpers import query, run_until_idle, runs_per_job

CLI = [sys.executable, "-m", "shardworker"]


def tags_of(dsn: str) -> dict[int, list[str] | None]:
    return dict(query(dsn, "SELECT id, tags FROM shardworker.jobs ORDER BY id"))


def test_every_enqueue_path_keeps_the_tags_sorted_and_once(pg_dsn: str, tmp_path: Path) -> None:
    one = shardworker.enqueue(pg_dsn, "k", tags=["b", "a", "b"])
    with psycopg.connect(pg_dsn) as conn:
        mine = shardworker.enqueue(conn, "k", tags=("x",))
    later = asyncio.run(shardworker.enqueue_async(pg_dsn, "k", tags=["async"]))
    copied = shardworker.enqueue_many(pg_dsn, [JobSpec("k", tags=("bulk",)), JobSpec("k")])
    dependent = shardworker.enqueue_many(pg_dsn, [JobSpec("k", after=(one,), tags=("after",))])
    debounced = shardworker.enqueue(pg_dsn, "k", dedupe_key="d", debounce=60, tags=["debounced"])
    lines = tmp_path / "jobs.jsonl"
    lines.write_text('{"kind": "k", "tags": ["file"]}\n{"kind": "k"}\n')
    from_file = subprocess.run([*CLI, "enqueue", "--file", str(lines), "--tag", "default", "--json", "--dsn", pg_dsn],
                               capture_output=True, text=True, timeout=60)
    from_cli = subprocess.run([*CLI, "enqueue", "k", "--tag", "cli", "--tag", "two", "--json", "--dsn", pg_dsn],
                              capture_output=True, text=True, timeout=60)
    assert from_file.returncode == 0 and from_cli.returncode == 0, (from_file.stderr, from_cli.stderr)
    sql = query(pg_dsn, "SELECT shardworker.enqueue('k', tags => ARRAY['sql', 'sql', 'a'])")[0][0]
    found = tags_of(pg_dsn)
    assert found[one] == ["a", "b"] and found[mine] == ["x"] and found[later] == ["async"]
    assert found[copied[0]] == ["bulk"] and found[copied[1]] is None
    assert found[dependent[0]] == ["after"] and found[debounced] == ["debounced"] and found[sql] == ["a", "sql"]
    assert sorted(t for t in found.values() if t and ("file" in t or "default" in t)) == [["default"], ["file"]]
    assert ["cli", "two"] in found.values()
    assert jobs.get_job(pg_dsn, one).tags == ["a", "b"]


@pytest.mark.parametrize(("tags", "says"), [
    ("import", "tags must be a list of strings"),
    ([""], "a tag must be a non-empty string"),
    (["x" * 256], "tag is 256 bytes of UTF-8, the limit is 255"),
    ([f"t{n}" for n in range(21)], "21 tags, the most a job may carry is 20"),
    (["a\x00b"], "NUL"),
])
def test_bad_tags_are_refused_and_nothing_is_enqueued(pg_dsn: str, tags: object, says: str) -> None:
    with pytest.raises(EnqueueError, match=says):
        shardworker.enqueue(pg_dsn, "k", tags=tags)  # type: ignore[arg-type]
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs") == [(0,)]


def test_a_handlers_follow_up_carries_its_tags(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    (parent,) = [shardworker.enqueue(pg_dsn, "import", {"customer": 42})]
    assert run_until_idle(pg_dsn, dirs, app="tagging_app") == 0
    (child,) = [j for j in jobs.list_jobs(pg_dsn, tag="customer:42")]
    assert child.kind == "notify" and child.tags == ["customer:42", "notify"] and child.id != parent
    assert child.status == "done"


def test_bulk_actions_by_tag_and_error_with_a_dry_run_first(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    ana = shardworker.enqueue_many(pg_dsn, [JobSpec("charge", {"who": "ana"}, tags=("billing", "customer:1"))
                                            for _ in range(3)])
    bob = shardworker.enqueue_many(pg_dsn, [JobSpec("charge", {"who": "bob"}, tags=("billing", "customer:2"))
                                            for _ in range(2)])
    waiting = shardworker.enqueue(pg_dsn, "later", tags=["billing"], delay_s=3600)
    assert run_until_idle(pg_dsn, dirs, app="tagging_app") == 0
    assert {j.id for j in jobs.list_jobs(pg_dsn, tag=["billing", "customer:1"])} == set(ana)
    assert {j.id for j in jobs.list_jobs(pg_dsn, error_contains="DECLINED FOR BOB")} == set(bob)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, "jobs", *args, "--dsn", pg_dsn], capture_output=True, text=True, timeout=60)

    dry = cli("retry", "--tag", "customer:1", "--dry-run")
    assert dry.returncode == 0 and "would retry 3 jobs (nothing changed: --dry-run)" in dry.stdout
    assert {s for (s,) in query(pg_dsn, "SELECT status FROM shardworker.jobs WHERE id = ANY(%s)", ana)} == {"failed"}
    retried = cli("retry", "--tag", "customer:1", "--json")
    assert retried.returncode == 0 and retried.stdout.strip() == '{"retry":3}'
    assert {s for (s,) in query(pg_dsn, "SELECT status FROM shardworker.jobs WHERE id = ANY(%s)", ana)} == {"queued"}
    listed = cli("list", "--error-contains", "declined for bob", "--json")
    assert sorted(j["id"] for j in __import__("json").loads(listed.stdout)) == sorted(bob)
    cancelled = cli("cancel", "--tag", "billing")  # the queued ones: ana's three and the later job
    assert cancelled.returncode == 0 and "4 jobs cancelled" in cancelled.stdout
    assert query(pg_dsn, "SELECT status FROM shardworker.jobs WHERE id = %s", waiting) == [("cancelled",)]
    assert jobs.delete_matching(pg_dsn, tag="customer:2", dry_run=True) == 2
    deleted = cli("delete", "--tag", "customer:2", "--status", "failed")
    assert deleted.returncode == 0 and "2 jobs deleted" in deleted.stdout
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE id = ANY(%s)", bob) == [(0,)]
    refused = cli("delete", "--dry-run")
    assert refused.returncode == 1 and "--dry-run goes with filters" in refused.stderr
    with pytest.raises(JobsError, match="give at least one filter"):
        jobs.cancel_matching(pg_dsn)
    both = cli("cancel", str(ana[0]), "--tag", "billing")
    assert both.returncode == 1 and "give job ids, or filters" in both.stderr
    assert {runs_per_job(dirs[1])[i] for i in ana + bob} == {1}


def test_a_debounced_enqueue_takes_the_new_tags_with_its_payload(pg_dsn: str) -> None:
    first = shardworker.enqueue(pg_dsn, "k", {"v": 1}, dedupe_key="d", debounce=60, tags=["old"])
    again = shardworker.enqueue(pg_dsn, "k", {"v": 2}, dedupe_key="d", debounce=60, tags=["new"])
    assert first == again and query(pg_dsn, "SELECT payload, tags FROM shardworker.jobs") == [({"v": 2}, ["new"])]


def test_a_bulk_delete_leaves_the_jobs_live_jobs_wait_on_and_a_dry_run_locks_nothing(pg_dsn: str) -> None:
    """A done job another still waits on (after=) is left out of a bulk delete, as retention
    leaves it, so the waiting job is not cancelled; a dry run counts while a claim holds a row."""
    done, later = shardworker.enqueue_many(pg_dsn, [JobSpec("a", tags=("import",)),
                                                    JobSpec("b", tags=("import",), run_at=None)])
    waiter = shardworker.enqueue(pg_dsn, "c", after=[done, later])
    query(pg_dsn, "UPDATE shardworker.jobs SET status = 'done', finished_at = now() WHERE id = %s RETURNING id", done)
    lone = shardworker.enqueue(pg_dsn, "d", tags=["import"])
    query(pg_dsn, "UPDATE shardworker.jobs SET status = 'done', finished_at = now() WHERE id = %s RETURNING id", lone)
    with psycopg.connect(pg_dsn) as holder:
        holder.execute("SELECT id FROM shardworker.jobs WHERE id = %s FOR UPDATE", (lone,))  # a claim's lock
        assert jobs.delete_matching(pg_dsn, tag="import", status="done", dry_run=True) == 1  # not blocked
    assert jobs.delete_matching(pg_dsn, tag="import", status="done") == 1
    assert sorted(i for (i,) in query(pg_dsn, "SELECT id FROM shardworker.jobs")) == sorted([done, later, waiter])
    assert query(pg_dsn, "SELECT status FROM shardworker.jobs WHERE id = %s", waiter) == [("waiting",)]
