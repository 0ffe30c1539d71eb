"""Unit tests of ``WorkerConfig``: its defaults, each invalid setting refused naming its field,
frozen, and the prefetch bounds it derives."""

from __future__ import annotations

import pytest

from shardworker.core.config import WorkerConfig
from shardworker.core.layout import PARENT_SHARD
from shardworker.errors import ConfigError


def test_worker_config_defaults_are_valid() -> None:
    """A config with only the required fields constructs and keeps the documented defaults."""
    config = WorkerConfig(dsn="postgresql://x", app_ref="m:app")
    assert config.procs == 2
    assert config.outbox_dir == ".shardworker/outbox"
    assert config.rescue_after_s > 2 * config.heartbeat_interval_s


@pytest.mark.parametrize(("field", "value"), [
    ("procs", 0),
    ("procs", PARENT_SHARD),
    ("claim_batch", 0),
    ("prefetch_batch", 0),
    ("concurrency", 0),
    ("prefetch_bytes", 10),
    ("poll_interval_s", 0.0),
    ("group_commit_max_delay_s", -0.1),
    ("group_commit_max_records", 0),
    ("flush_batch", 0),
    ("backoff_base_s", 0.0),
    ("backoff_base_s", 10.0),  # above the 5 s cap
    ("min_free_bytes", -1),
    ("segment_bytes", 100),
    ("shutdown_timeout_s", -1.0),
    ("heartbeat_interval_s", 0.0),
    ("rescue_after_s", 4.0),  # not more than twice the 2 s heartbeat
    ("queues", ("a", "")),
])
def test_worker_config_rejects_bad_field_naming_it(field: str, value: object) -> None:
    """An invalid setting raises ConfigError whose message starts with the field's name."""
    with pytest.raises(ConfigError) as info:
        WorkerConfig(dsn="postgresql://x", app_ref="m:app", **{field: value})  # type: ignore[arg-type]
    assert str(info.value).startswith(field), str(info.value)


@pytest.mark.parametrize(("field", "value"), [("connect_timeout_s", 0), ("statement_timeout_s", 0.0),
                                              ("network_timeout_s", 1)])
def test_worker_config_rejects_bad_timeouts_naming_them(field: str, value: object) -> None:
    """An invalid connection timeout raises ConfigError naming the field at construction."""
    with pytest.raises(ConfigError, match=f"^{field}"):
        WorkerConfig(dsn="postgresql://x", app_ref="m:app", **{field: value})  # type: ignore[arg-type]


def test_worker_config_is_frozen() -> None:
    """A built config cannot be mutated."""
    config = WorkerConfig(dsn="postgresql://x", app_ref="m:app")
    with pytest.raises(AttributeError):
        config.procs = 3  # type: ignore[misc]


def test_worker_config_prefetch_jobs_is_concurrency_plus_batch_up_to_max() -> None:
    config = WorkerConfig(app_ref="a:b", dsn="postgresql://x/y", concurrency=100, prefetch_batch=64,
                          prefetch_max_jobs=1000)
    assert config.prefetch_jobs(False) == (65, 1001)
    assert config.prefetch_jobs(True) == (300, 1100)  # async or threads: twice --concurrency beyond it


def test_worker_config_prefetch_jobs_of_a_concurrent_child_stays_within_the_max() -> None:
    small = WorkerConfig(app_ref="a:b", dsn="postgresql://x/y", concurrency=10, prefetch_batch=64)
    assert small.prefetch_jobs(True)[0] == 74  # prefetch_batch is more than twice the concurrency
    big = WorkerConfig(app_ref="a:b", dsn="postgresql://x/y", concurrency=1000, prefetch_batch=64,
                       prefetch_max_jobs=1000)
    assert big.prefetch_jobs(True) == (2000, 2000)
