"""``shardworker run`` reads its defaults from ``WorkerConfig``: the command and the library
cannot drift apart (changing a default in shardworker/core/config.py changes the command)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from shardworker.cli.main import main
from shardworker.core.config import WorkerConfig
from shardworker.worker import supervisor
from tests.helpers import APPS_DIR


class CapturingSupervisor:
    """Stands in for the worker: keeps the config ``run`` built, runs nothing."""

    built: list[WorkerConfig] = []

    def __init__(self, config: WorkerConfig, app: Any) -> None:
        self.built.append(config)

    def run(self) -> supervisor.RunSummary:
        return supervisor.RunSummary()


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[WorkerConfig]:
    monkeypatch.syspath_prepend(str(APPS_DIR))
    monkeypatch.setattr(supervisor, "Supervisor", CapturingSupervisor)
    monkeypatch.chdir(tmp_path)
    for name in ("SHARDWORKER_DEFAULT_TIMEOUT", "SHARDWORKER_CONCURRENCY", "SHARDWORKER_OUTBOX_DIR",
                 "SHARDWORKER_METRICS_PORT", "SHARDWORKER_METRICS_HOST", "SHARDWORKER_METRICS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    CapturingSupervisor.built = []
    return CapturingSupervisor.built


def test_run_without_options_is_the_default_worker_config(captured: list[WorkerConfig]) -> None:
    dsn = "postgresql://app@db.invalid/app"
    result = CliRunner().invoke(main, ["run", "--app", "counting_app", "--dsn", dsn])
    assert result.exit_code == 0, result.output
    [config] = captured
    assert config == WorkerConfig(dsn=dsn, app_ref="counting_app")


def test_every_run_option_is_shown_with_the_config_default() -> None:
    """``--help`` shows the numbers the worker uses (durations in their shortest unit)."""
    run = main.commands["run"]
    shown = {p.name: p.default for p in run.params}
    d = {f.name: f.default for f in dataclasses.fields(WorkerConfig)}
    assert (shown["procs"], shown["shutdown_timeout"], shown["rescue_after"], shown["prefetch"]) == (
        d["procs"], d["shutdown_timeout_s"], d["rescue_after_s"], d["prefetch_batch"])
    assert (shown["default_timeout"], shown["retention"]) == ("30m", "7d")
    assert d["default_timeout_s"] == 1800 and d["retention_s"] == 7 * 86400


def test_sub_configs_are_derived_and_take_keywords_only() -> None:
    config = WorkerConfig(dsn="postgresql://x/y", app_ref="a", connect_timeout_s=3, flush_batch=7, concurrency=9)
    assert config.store_config().connect_timeout_s == 3 and config.flusher_config().flush_batch == 7
    assert config.child_config(1, parent_pid=42, slots=5).concurrency == 9
    with pytest.raises(TypeError):
        WorkerConfig("postgresql://x/y", "a")  # type: ignore[misc]
