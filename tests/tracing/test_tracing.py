"""OpenTelemetry across processes (issue 45, 3), through the console script: the web side
enqueues inside a ``checkout`` span in one process; the worker's children, with the SDK their
startup hook set up, continue that trace. Spans come from the SDK's in-memory exporter of
each process (``tests/tracing/shop_tracing.py``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import query

pytest.importorskip("opentelemetry.sdk.trace")

HERE = Path(__file__).parent


def project(tmp_path: Path) -> Path:
    """A shop's project directory: its app module and its own folders."""
    root = tmp_path / "shop"
    (root / "var").mkdir(parents=True)
    shutil.copy(HERE / "shop_tracing.py", root / "shop_tracing.py")
    return root


def env(root: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(root)}


def spans(root: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in sorted((root / "var" / "spans").glob("*.jsonl"))
            for line in path.read_text().splitlines()]


def run_worker(root: Path, dsn: str) -> None:
    done = subprocess.run([shutil.which("shardworker") or "shardworker", "run", "--app", "shop_tracing:app",
                           "--procs", "2", "--dsn", dsn, "--outbox-dir", "var/outbox", "--exit-when-idle"],
                          cwd=root, env=env(root), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def by_name(found: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [s for s in found if s["name"] == name]


def test_runs_steps_and_follow_ups_continue_the_enqueuers_trace(pg_dsn: str, tmp_path: Path) -> None:
    root = project(tmp_path)
    web = subprocess.run([sys.executable, "shop_tracing.py", "enqueue", pg_dsn], cwd=root, env=env(root),
                         capture_output=True, text=True, timeout=60)
    assert web.returncode == 0, web.stderr
    (checkout,) = by_name(spans(root), "checkout")
    trace_id, checkout_id = checkout["context"]["trace_id"], checkout["context"]["span_id"]
    rows = dict(query(pg_dsn, "SELECT kind || coalesce(':' || (payload->>'to'), ''), trace "
                              "FROM shardworker.jobs"))
    assert rows["notify:nobody"] is None  # enqueued outside any span: nothing kept
    for kind in ("order", "flaky", "notify:ana", "notify:bo"):
        assert rows[kind]["carrier"]["traceparent"].startswith(f"00-{trace_id[2:]}-{checkout_id[2:]}-"), rows[kind]

    run_worker(root, pg_dsn)
    assert set(query(pg_dsn, "SELECT status FROM shardworker.jobs")) == {("done",)}
    found = [s for s in spans(root) if s["name"] != "checkout"]
    runs = {(s["attributes"]["shardworker.job.kind"], s["attributes"]["shardworker.job.attempt"]): s
            for s in found if s["name"].startswith("run ")}
    ids = dict(query(pg_dsn, "SELECT kind || coalesce(':' || (payload->>'to'), ''), id FROM shardworker.jobs"))

    order = runs[("order", 1)]
    assert order["kind"] == "SpanKind.CONSUMER" and order["parent_id"] == checkout_id
    assert order["context"]["trace_id"] == trace_id
    assert order["attributes"] == {"messaging.system": "shardworker", "shardworker.job.id": ids["order"],
                                   "shardworker.job.kind": "order", "shardworker.job.queue": "default",
                                   "shardworker.job.attempt": 1, "shardworker.job.outcome": "done"}
    (charge,) = by_name(found, "step charge")
    assert charge["parent_id"] == order["context"]["span_id"] and charge["kind"] == "SpanKind.INTERNAL"
    (enqueued,) = by_name(found, "enqueue receipt")
    assert enqueued["parent_id"] == order["context"]["span_id"] and enqueued["kind"] == "SpanKind.PRODUCER"
    receipt = runs[("receipt", 1)]
    assert receipt["parent_id"] == enqueued["context"]["span_id"] and receipt["context"]["trace_id"] == trace_id

    # The retried job: three runs in the enqueuer's trace, the failed ones marked, each later
    # run linked to every run before it.
    flaky = [runs[("flaky", n)] for n in (1, 2, 3)]
    assert all(s["parent_id"] == checkout_id and s["context"]["trace_id"] == trace_id for s in flaky)
    assert [s["attributes"]["shardworker.job.outcome"] for s in flaky] == ["retry", "retry", "done"]
    assert [s["status"]["status_code"] for s in flaky] == ["ERROR", "ERROR", "UNSET"]
    assert "gateway busy (1)" in flaky[0]["status"]["description"]
    linked = [[link["context"]["span_id"] for link in s["links"]] for s in flaky]
    assert linked == [[], [flaky[0]["context"]["span_id"]],
                      [flaky[0]["context"]["span_id"], flaky[1]["context"]["span_id"]]]
    kept = query(pg_dsn, "SELECT trace -> 'runs' FROM shardworker.jobs WHERE kind = 'flaky'")[0][0]
    assert [run.rsplit("-", 1)[0] for run in kept] == [f"00-{trace_id[2:]}-{s['context']['span_id'][2:]}"
                                                       for s in flaky[:2]]

    # The async handler's runs and steps, traced or not.
    notify_runs = [s for s in found if s["name"] == "run notify"]
    assert len(notify_runs) == 3
    by_id = {s["attributes"]["shardworker.job.id"]: s for s in notify_runs}
    assert by_id[ids["notify:nobody"]]["parent_id"] is None  # a root: its enqueue traced nothing
    assert by_id[ids["notify:nobody"]]["context"]["trace_id"] != trace_id
    for who in ("notify:ana", "notify:bo"):
        assert by_id[ids[who]]["parent_id"] == checkout_id
    sends = by_name(found, "step send")
    assert sorted(s["parent_id"] for s in sends) == sorted(s["context"]["span_id"] for s in notify_runs)


def test_an_application_that_traces_nothing_keeps_nothing(pg_dsn: str, dirs: tuple[Path, Path]) -> None:
    """The API imported but no SDK set up (the default provider): enqueue writes no trace and
    the worker's runs leave none, as with no OpenTelemetry at all: a job that fails three
    times keeps no run spans either."""
    import opentelemetry.trace as otel

    from shardworker import enqueue
    from shardworker.core import tracing
    from tests.helpers import run_until_idle

    assert isinstance(otel.get_tracer_provider(), otel.ProxyTracerProvider)
    with otel.get_tracer("test").start_as_current_span("not recorded"):
        assert tracing.carrier() is None
        job_id = enqueue(pg_dsn, "fail", {"n": 1})
    assert run_until_idle(pg_dsn, dirs) == 0
    assert query(pg_dsn, "SELECT status, trace FROM shardworker.jobs WHERE id = %s", job_id) == [("failed", None)]
