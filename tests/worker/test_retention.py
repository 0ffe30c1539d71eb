"""Retention: pruning finished jobs in batches under a running worker, by hand, two
pruners at once; `--retention 0` keeps everything; failed and cancelled jobs kept longer
(`--retention-failed`) and `prune --status`; workers and migrate --print."""

from __future__ import annotations

import itertools
import json
import subprocess
import threading
from pathlib import Path

import psycopg
from click.testing import CliRunner

from shardworker.cli.main import main
from shardworker.core.config import WorkerConfig
from shardworker.core.retry import Backoff
from shardworker.store.pg_store import PgStore, StoreConfig
from shardworker.worker.housekeeping import Housekeeper, prune
from tests.cli.test_project_dir import shardworker_script
from tests.helpers import enqueue, execute, exit_code, query, runs_per_job, start_worker, wait_for

OLD = "INSERT INTO shardworker.jobs (kind, status, finished_at) SELECT 'old', s, now() - interval '8 days' " \
      "FROM generate_series(1, %s) g, unnest(ARRAY['done', 'failed', 'cancelled']) s"


def count(dsn: str, where: str = "true") -> int:
    return int(query(dsn, f"SELECT count(*) FROM shardworker.jobs WHERE {where}")[0][0])


def test_prune_by_hand_deletes_only_old_finished_jobs_and_refuses_bad_input(pg_dsn: str) -> None:
    execute(pg_dsn, OLD, 1000)
    recent = enqueue(pg_dsn, "recent", 5)
    execute(pg_dsn, "UPDATE shardworker.jobs SET status = 'done', finished_at = now() - interval '1 day' "
                    "WHERE id = %s", recent[0])
    execute(pg_dsn, "UPDATE shardworker.jobs SET finished_at = now() - interval '30 days' WHERE id = %s", recent[1])
    result = CliRunner().invoke(main, ["prune", "--older-than", "7d", "--json", "--dsn", pg_dsn])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == '{"pruned":3000}'
    assert count(pg_dsn) == 5  # the queued one with an old finished_at is not finished: kept
    for bad in ("7 days", "-1d", "soon"):
        refused = CliRunner().invoke(main, ["prune", "--older-than", bad, "--dsn", pg_dsn])
        assert refused.exit_code == 2 and "is not a duration" in refused.output and "Traceback" not in refused.output


def test_two_pruners_at_once_delete_everything_once(pg_dsn: str) -> None:
    execute(pg_dsn, OLD, 2000)
    totals: list[int] = []

    def run() -> None:
        store = PgStore(StoreConfig(dsn=pg_dsn))
        try:
            totals.append(prune(store, 7 * 86400, batch=500))
        finally:
            store.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sum(totals) == 6000 and count(pg_dsn) == 0


def test_retention_zero_keeps_everything_and_a_round_prunes_in_batches(pg_dsn: str) -> None:
    execute(pg_dsn, OLD, 1000)
    store = PgStore(StoreConfig(dsn=pg_dsn))
    try:
        ticks = itertools.count(0, 10.0)  # a clock far past the first round's start
        keeper = Housekeeper(store, [], 0, Backoff(0.05, 1))
        keeper.run_once()
        assert count(pg_dsn) == 3000
        pruner = Housekeeper(store, [], 7 * 86400, Backoff(0.05, 1), prune_interval_s=0.01,
                             clock=lambda: next(ticks))
        turns = 0
        while count(pg_dsn) and turns < 10:
            pruner.run_once()
            turns += 1
        assert count(pg_dsn) == 0 and turns == 3  # 1,000 a batch, one batch a turn
    finally:
        store.close()


def test_a_running_worker_prunes_while_it_works(pg_dsn: str, tmp_path: Path) -> None:
    count_dir = tmp_path / "count"
    count_dir.mkdir()
    execute(pg_dsn, OLD, 2000)
    proc = start_worker(pg_dsn, tmp_path / "outbox", count_dir, "--retention", "7d", "--retention-failed", "7d",
                        procs=2)
    ids = enqueue(pg_dsn, "count", 3000)
    wait_for(lambda: count(pg_dsn, "kind = 'old'") == 0, 60, "old jobs pruned")
    wait_for(lambda: count(pg_dsn, "status = 'done'") == 3000, 60, "new jobs done")
    workers = CliRunner().invoke(main, ["workers", "--json", "--dsn", pg_dsn])
    assert workers.exit_code == 0 and '"live":true' in workers.stdout and '"jobs_running":' in workers.stdout
    proc.terminate()
    assert exit_code(proc, 60, count_dir) == 0
    assert set(runs_per_job(count_dir).values()) == {1} and len(runs_per_job(count_dir)) == len(ids)


def test_migrate_print_applies_with_psql_style_tools(empty_dsn: str) -> None:
    script = CliRunner().invoke(main, ["migrate", "--print"])
    assert script.exit_code == 0 and "BEGIN;" in script.stdout
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(script.stdout.encode())
    again = CliRunner().invoke(main, ["migrate", "--dsn", empty_dsn])
    assert again.exit_code == 0 and "applied 0 migration(s)" in again.stdout
    stats = CliRunner().invoke(main, ["stats", "--dsn", empty_dsn])
    assert stats.exit_code == 0, stats.output


def aged(dsn: str, days: int, per_status: int) -> None:
    """``per_status`` jobs of each finished status, finished ``days`` ago, of kind ``aged-DAYS``."""
    execute(dsn, "INSERT INTO shardworker.jobs (kind, status, finished_at) "
                 "SELECT %s, s, now() - make_interval(days => %s) "
                 "FROM generate_series(1, %s) g, unnest(ARRAY['done', 'failed', 'cancelled']) s",
            f"aged-{days}", days, per_status)


def by_kind_and_status(dsn: str) -> dict[tuple[str, str], int]:
    return {(k, s): n for k, s, n in query(dsn, "SELECT kind, status, count(*) FROM shardworker.jobs "
                                                "WHERE kind LIKE 'aged-%%' GROUP BY 1, 2")}


def test_prune_takes_status_through_the_console_script(pg_dsn: str) -> None:
    """prune --status failed deletes only failed jobs; --status twice takes both; a status that
    is not finished is a usage error in one line."""
    aged(pg_dsn, 8, 100)

    def prune_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*shardworker_script(), "prune", "--older-than", "7d", *args, "--dsn", pg_dsn],
                              capture_output=True, text=True, timeout=60)

    only_failed = prune_cli("--status", "failed", "--json")
    assert only_failed.returncode == 0, only_failed.stderr
    assert json.loads(only_failed.stdout) == {"pruned": 100}
    assert by_kind_and_status(pg_dsn) == {("aged-8", "done"): 100, ("aged-8", "cancelled"): 100}
    both = prune_cli("--status", "done", "--status", "cancelled")
    assert (both.returncode, both.stdout) == (0, "pruned 200 jobs\n")
    refused = prune_cli("--status", "queued")
    assert refused.returncode == 2 and "'queued' is not one of 'done', 'failed', 'cancelled'" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_worker_keeps_failed_and_cancelled_jobs_longer_than_done_ones(pg_dsn: str, tmp_path: Path) -> None:
    """With the defaults (--retention 7d, --retention-failed 30d) a running worker prunes done
    jobs 8 days old and every job 31 days old, and keeps failed and cancelled ones 8 days old."""
    count_dir = tmp_path / "count"
    count_dir.mkdir()
    aged(pg_dsn, 8, 100)
    aged(pg_dsn, 31, 100)
    proc = start_worker(pg_dsn, tmp_path / "outbox", count_dir, procs=1)
    wait_for(lambda: by_kind_and_status(pg_dsn) == {("aged-8", "failed"): 100, ("aged-8", "cancelled"): 100}, 60,
             "done jobs pruned after 7 days, failed and cancelled ones after 30")
    proc.terminate()
    assert exit_code(proc, 60, count_dir) == 0
    log = (count_dir / "worker.log").read_text()
    assert "pruned 200 done jobs finished over 7d ago (--retention)" in log
    assert "pruned 200 failed and cancelled jobs finished over 30d ago (--retention-failed)" in log


def test_failed_retention_defaults_to_30_days_or_the_longer_retention() -> None:
    """--retention-failed unset: 30 days, or --retention when that is longer; --retention 0
    (keep every finished job) keeps failed and cancelled ones too; set, it is what it says."""
    def failed_s(**fields: float | None) -> float:
        return WorkerConfig(dsn="postgresql://x/y", app_ref="a", **fields).failed_retention_s  # type: ignore[arg-type]

    assert failed_s() == 30 * 86400
    assert failed_s(retention_s=90 * 86400) == 90 * 86400
    assert failed_s(retention_s=0) == 0
    assert failed_s(retention_s=0, retention_failed_s=86400) == 86400
    assert failed_s(retention_failed_s=0) == 0
    shown = {p.name: p for p in main.commands["run"].params}["retention_failed"]
    assert shown.default is None and "30d" in str(shown.show_default)
