"""Seeing a worker: ``/metrics`` scraped during a run and through a real outage (the server
stopped: pending outcomes rise, the database gauge drops to 0, then both come back), the
JSON logs parsed line by line (one line per database state change, not one per retry),
and the metrics server's binding and token rules."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shardworker.embedded import EmbeddedPostgres
from shardworker.errors import ConfigError
from tests.conftest import free_port
from tests.helpers import enqueue, query, runs_per_job, start_worker, status_counts, wait_for, worker_env, worker_log


def scrape(port: int, token: str | None = None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics``: {(name, sorted labels): value}."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=5) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def scrape_when_up(port: int, timeout_s: float = 30) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return scrape(port)
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def json_lines(log: str) -> list[dict[str, Any]]:
    """Every line of a --log-format json worker's stderr, parsed (a line that is not JSON fails)."""
    return [json.loads(line) for line in log.splitlines() if line.strip()]


def test_metrics_and_json_logs_through_an_outage(private_pg: EmbeddedPostgres, tmp_path: Path) -> None:
    dsn, count_dir, port = private_pg.dsn, tmp_path / "counts", free_port()
    count_dir.mkdir()
    slow = enqueue(dsn, "slow", 300, {"sleep": 0.04})
    enqueue(dsn, "fail", 2)  # three attempts each: two retried, then failed
    proc = start_worker(dsn, tmp_path / "outbox", count_dir, "--metrics-port", str(port), "--log-format", "json",
                        "--backoff-cap", "0.5", "--prefetch", "200", procs=2)
    scrape_when_up(port)
    # Served from the start; up once the worker's schema check or first claim answered.
    wait_for(lambda: value(scrape(port), "shardworker_database_up") == 1, 30, "the database up in the metrics")
    wait_for(lambda: status_counts(dsn).get("done", 0) >= 30, 30, "a first part done")

    private_pg.stop("immediate")
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def outage_seen() -> bool:
        nonlocal samples
        samples = scrape(port)
        return (value(samples, "shardworker_database_up") == 0 and total(samples, "shardworker_outbox_pending") > 0
                and value(samples, "shardworker_outcomes_unapplied") > 0)

    wait_for(outage_seen, 30, "the outage in the metrics")
    pending_early = total(samples, "shardworker_outbox_pending")
    wait_for(lambda: total(scrape(port), "shardworker_outbox_pending") > pending_early, 30,
             "pending outcomes to rise while children finish what they hold")
    assert value(scrape(port), "shardworker_database_errors_total") > 0
    time.sleep(2.0)  # several retries at the 0.5 s cap: still one line
    private_pg.start()

    def recovered() -> bool:
        s = scrape(port)
        return (value(s, "shardworker_database_up") == 1 and total(s, "shardworker_outbox_pending") == 0
                and value(s, "shardworker_outcomes_unapplied") == 0 and status_counts(dsn).get("done") == 300)

    wait_for(recovered, 60, "the database back, the outbox empty and every slow job done")
    wait_for(lambda: status_counts(dsn) == {"done": 300, "failed": 2}, 30, "the failing jobs to fail for good")
    # The flusher publishes its counters after the pass that applied them (its checkpoint comes
    # between the commit and the publish): the last batch's count may trail the rows a moment.
    try:
        wait_for(lambda: value(scrape(port), "shardworker_outcomes_applied_total") == 306, 10,
                 f"the last applied batch in the counters {value(scrape(port), 'shardworker_outcomes_applied_total')}")
    except AssertionError as exc:  # seen rarely (2 full runs of 5, 2026-12-07): say what the flusher counted
        counted = {name: v for (name, _), v in scrape(port).items() if name.startswith("shardworker_outcomes")}
        rows = query(dsn, "SELECT kind, status, attempt, applied_attempt, count(*) FROM shardworker.jobs "
                          "GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3")
        raise AssertionError(f"{exc}; counters {counted}; rows {rows}; log tail:\n{worker_log(count_dir)[-3000:]}") \
            from None
    assert_finished_counts(scrape(port))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, worker_log(count_dir)
    assert [runs_per_job(count_dir)[i] for i in slow] == [1] * 300, "a handler ran again after the outage"

    assert_outage_told_once_in_json(json_lines(worker_log(count_dir)))


def assert_finished_counts(end: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> None:
    """The counters at the end of the outage run: 300 slow jobs done, 2 failing jobs retried twice each."""
    assert value(end, "shardworker_jobs_finished_total", kind="slow", outcome="done") == 300
    assert value(end, "shardworker_jobs_finished_total", kind="fail", outcome="retried") == 4
    assert value(end, "shardworker_jobs_finished_total", kind="fail", outcome="failed") == 2
    assert value(end, "shardworker_handler_duration_seconds_count", kind="slow") == 300
    assert 300 * 0.04 <= value(end, "shardworker_handler_duration_seconds_sum", kind="slow") < 300 * 0.5
    assert value(end, "shardworker_handler_duration_seconds_bucket", kind="slow", le="+Inf") == 300
    assert value(end, "shardworker_jobs_claimed_total") == 306
    assert value(end, "shardworker_outcomes_applied_total") == 306
    assert value(end, "shardworker_flush_batch_size_count") >= 1


def assert_outage_told_once_in_json(lines: list[dict[str, Any]]) -> None:
    """Every line carries the standard fields; the outage is told once when it starts, once when it ends."""
    assert all({"time", "level", "role", "worker_id", "logger", "message"} <= line.keys() for line in lines)
    lost = [line for line in lines if line["message"].startswith("database unreachable")]
    back = [line for line in lines if line["message"].startswith("database back after")]
    assert [(line["role"], line["level"]) for line in lost] == [("parent", "WARNING")], lost
    assert [(line["role"], line["level"]) for line in back] == [("parent", "INFO")], back
    assert back[0]["outcomes_waited"] > 0 and back[0]["outage_s"] >= 2.0
    # Nor does each part of the parent tell the outage again (heartbeat, housekeeping).
    others = [line for line in lines if line["level"] == "WARNING" and line["role"] == "parent" and line not in lost]
    assert not others, others
    worker_id = back[0]["worker_id"]
    assert worker_id and {line["worker_id"] for line in lines} == {worker_id}
    failures = [line for line in lines if line["logger"] == "shardworker.child.main"]
    assert len(failures) == 6 and {line["kind"] for line in failures} == {"fail"}
    assert all(isinstance(line["job_id"], int) and line["role"].startswith("shard-") for line in failures)
    assert sum(1 for line in lines if line["level"] == "ERROR") == 2  # the two final failures


def run_cli(*args: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardworker", *args], capture_output=True, text=True,
                          timeout=timeout_s, env=worker_env(Path("/nonexistent")))


def test_metrics_beyond_loopback_need_a_token(pg_dsn: str, tmp_path: Path) -> None:
    refused = run_cli("run", "--app", "counting_app", "--outbox-dir", str(tmp_path / "outbox"), "--dsn", pg_dsn,
                      "--metrics-port", str(free_port()), "--metrics-host", "0.0.0.0")
    assert refused.returncode == 2, refused.stderr
    assert "0.0.0.0 is reachable from other hosts: give --metrics-token" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (tmp_path / "outbox").exists()


def test_a_token_guards_the_metrics(pg_dsn: str, tmp_path: Path) -> None:
    count_dir, port = tmp_path / "counts", free_port()
    count_dir.mkdir()
    proc = start_worker(pg_dsn, tmp_path / "outbox", count_dir, "--metrics-port", str(port),
                        "--metrics-token", "s3cret-token")
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
            raise AssertionError("metrics served without the token")
        except urllib.error.HTTPError as exc:
            assert exc.code == 401
            break
        except urllib.error.URLError:
            assert time.monotonic() < deadline, worker_log(count_dir)
            time.sleep(0.1)
    # database_up reads 0 until the worker's first schema check answers, a moment after the server starts.
    wait_for(lambda: value(scrape(port, "s3cret-token"), "shardworker_database_up") == 1, 30,
             "the database up in the metrics, scraped with the token")
    try:
        scrape(port, "wrong")
        raise AssertionError("a wrong token was accepted")
    except urllib.error.HTTPError as exc:
        assert exc.code == 401
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, worker_log(count_dir)
    assert "s3cret-token" not in worker_log(count_dir)


def test_a_metrics_port_in_use_is_one_line_and_exit_1(pg_dsn: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("run", "--app", "counting_app", "--outbox-dir", str(tmp_path / "outbox"), "--dsn", pg_dsn,
                         "--metrics-port", str(port))
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: cannot serve metrics on 127.0.0.1:{port}: Address already in use")


def test_a_worker_started_during_an_outage_says_the_database_is_down(private_pg: EmbeddedPostgres,
                                                                     tmp_path: Path) -> None:
    dsn, count_dir, port = private_pg.dsn, tmp_path / "counts", free_port()
    count_dir.mkdir()
    private_pg.stop("immediate")
    proc = start_worker(dsn, tmp_path / "outbox", count_dir, "--metrics-port", str(port), "--backoff-cap", "0.5")
    assert value(scrape_when_up(port), "shardworker_database_up") == 0
    private_pg.start()
    wait_for(lambda: value(scrape(port), "shardworker_database_up") == 1, 30, "the database up once it answers")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, worker_log(count_dir)


def test_a_refusal_is_a_json_line_too(pg_dsn: str, tmp_path: Path) -> None:
    refused = run_cli("run", "--app", "counting_app:nope", "--log-format", "json", "--outbox-dir",
                      str(tmp_path / "outbox"), "--dsn", pg_dsn)
    assert refused.returncode == 1
    [line] = json_lines(refused.stderr)
    assert (line["level"], line["role"]) == ("ERROR", "parent")
    assert line["message"].startswith("module 'counting_app' has no attribute 'nope'")


def test_the_metrics_server_on_ipv6_loopback_with_a_token() -> None:
    from shardworker.worker.metrics import MetricsServer

    server = MetricsServer("::1", 0, [], token="t0ken")
    try:
        server.start()
    except ConfigError as exc:  # a machine without IPv6 on loopback
        pytest.skip(str(exc))
    try:
        def status(path: str, auth: str | None) -> int:
            request = urllib.request.Request(f"http://[::1]:{server.port}{path}")
            if auth:
                request.add_header("Authorization", auth)
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    return int(response.status)
            except urllib.error.HTTPError as exc:
                return exc.code

        assert status("/metrics", None) == 401
        assert status("/metrics", "Bearer wrong") == 401
        assert status("/metrics", "bearer t0ken") == 200  # the scheme is case-insensitive
        assert status("/other", "Bearer t0ken") == 404
    finally:
        server.stop()


def test_each_process_of_the_tree_exports_its_cpu_and_memory(pg_dsn: str, tmp_path: Path) -> None:
    """The parent, each child and the flusher: CPU seconds and resident memory by role, from the
    processes themselves."""
    count_dir, port = tmp_path / "counts", free_port()
    count_dir.mkdir()
    enqueue(pg_dsn, "count", 300)
    proc = start_worker(pg_dsn, tmp_path / "outbox", count_dir, "--metrics-port", str(port), procs=2)
    try:
        scrape_when_up(port)
        wait_for(lambda: status_counts(pg_dsn).get("done", 0) == 300, 60, "the jobs done")
        samples = scrape(port)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    roles = {"parent", "shard-0", "shard-1", "flusher"}
    cpu = {dict(labels)["role"]: v for (name, labels), v in samples.items()
           if name == "shardworker_process_cpu_seconds_total"}
    rss = {dict(labels)["role"]: v for (name, labels), v in samples.items()
           if name == "shardworker_process_resident_memory_bytes"}
    assert set(cpu) == roles and set(rss) == roles
    # CPU counts in clock ticks (10 ms): a child that ran 150 trivial jobs may show none yet.
    assert all(v >= 0 for v in cpu.values()) and cpu["parent"] > 0, cpu
    assert all(v > 10 * 2**20 for v in rss.values()), rss
