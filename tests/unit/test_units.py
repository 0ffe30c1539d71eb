"""Unit tests of the pure parts: routing, retry policy, config, named queries, wire format,
handler registration, app loading and DSN redaction. No database, no processes (but one)."""

from __future__ import annotations

import collections
import json
import os
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

import shardworker.store
from shardworker.app import App, load_app
from shardworker.config import WorkerConfig
from shardworker.dsn import redact_dsn
from shardworker.errors import AppLoadError, ConfigError, DatabaseUnavailable, StoreError, TransientConflict
from shardworker.layout import PARENT_SHARD
from shardworker.model import Disposition, Outcome
from shardworker.retry import Backoff, is_retryable, job_retry_delay
from shardworker.routing import _mix64, shard_for
from shardworker.store.sql import parse_queries, queries
from shardworker.wire import decode_outcome, encode_outcome, outcome_key

REPO = Path(__file__).resolve().parents[2]

# --- routing ------------------------------------------------------------------------------

# Computed once with shard_for and pinned: a change here re-routes every job of a live outbox.
SHARD_TABLE = [
    (0, 1, 0), (0, 2, 1), (1, 2, 1), (1, 8, 1), (2, 8, 6), (3, 8, 5), (42, 4, 1), (42, 16, 5),
    (1000, 7, 0), (123456789, 10, 7), (2**63 - 1, 8, 7), (2**64 + 5, 8, 2), (-1, 8, 0), (7, 1, 0),
    (99, 3, 2), (10**12, 32, 24),
]


@pytest.mark.parametrize(("job_id", "shards", "expected"), SHARD_TABLE)
def test_shard_for_matches_pinned_table(job_id: int, shards: int, expected: int) -> None:
    """shard_for returns the pinned shard for each (id, shards) pair."""
    assert shard_for(job_id, shards) == expected


def test_mix64_is_the_splitmix64_finalizer() -> None:
    """The mixer equals reference SplitMix64: its first output for seed 0 is 0xE220A8397B1DCDAF."""
    assert _mix64(0) == 0xE220A8397B1DCDAF


def test_shard_for_is_stable_across_calls() -> None:
    """Repeated calls in one process give the same shard for the same id."""
    first = [shard_for(i, 13) for i in range(2000)]
    assert [shard_for(i, 13) for i in range(2000)] == first


def test_shard_for_is_stable_in_another_process_with_another_hash_seed() -> None:
    """A fresh interpreter with a different PYTHONHASHSEED routes ids exactly as this process does."""
    ids = [*range(500), 2**40 + 3, 2**63 - 1]
    code = textwrap.dedent(f"""
        import json
        from shardworker.routing import shard_for
        print(json.dumps([shard_for(i, n) for i in {ids!r} for n in (1, 2, 7, 16)]))
    """)
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                         check=True, timeout=60)
    assert json.loads(out.stdout) == [shard_for(i, n) for i in ids for n in (1, 2, 7, 16)]


@pytest.mark.parametrize("shards", [2, 7, 8, 16])
def test_shard_for_spreads_consecutive_ids_uniformly(shards: int) -> None:
    """10,000 consecutive ids land on every shard 0..n-1, each within 10% of an even share."""
    counts = collections.Counter(shard_for(i, shards) for i in range(1, 10_001))
    assert set(counts) == set(range(shards))
    expected = 10_000 / shards
    # A fair hash deviates by ~sqrt(expected) (<= ~35 at 1250): 10% is > 3.5 sigma.
    assert all(abs(n - expected) <= 0.10 * expected for n in counts.values()), counts
    chi2 = sum((n - expected) ** 2 / expected for n in counts.values())
    assert chi2 < 3 * shards + 10  # far above the mean (shards - 1) of a uniform spread


def test_shard_for_does_not_stripe_like_identity_hash() -> None:
    """Consecutive ids do not cycle through shards in order, as ``id % n`` would."""
    assert [shard_for(i, 4) for i in range(16)] != [i % 4 for i in range(16)]


@pytest.mark.parametrize("shards", [0, -1, -100])
def test_shard_for_rejects_fewer_than_one_shard(shards: int) -> None:
    """shard_for raises ValueError when asked for fewer than one shard."""
    with pytest.raises(ValueError, match="shards must be >= 1"):
        shard_for(5, shards)


# --- retry --------------------------------------------------------------------------------


def test_backoff_first_delay_is_jittered_within_half_to_full_base() -> None:
    """The first delay lies in [base/2, base]."""
    for seed in range(50):
        delay = Backoff(base_s=0.2, cap_s=5.0, rng=random.Random(seed)).next_delay()
        assert 0.1 <= delay <= 0.2


def test_backoff_doubles_until_the_cap_then_stays_within_half_cap_to_cap() -> None:
    """The ceiling doubles per failure up to the cap; every delay lies in [ceiling/2, ceiling]."""
    backoff = Backoff(base_s=0.05, cap_s=1.0, rng=random.Random(7))
    delays = [backoff.next_delay() for _ in range(60)]
    for failure, delay in enumerate(delays, 1):
        ceiling = min(1.0, 0.05 * 2 ** (failure - 1))
        assert ceiling / 2 <= delay <= ceiling, (failure, delay)
    assert max(delays) <= 1.0
    assert backoff.failures == 60


def test_backoff_is_capped_after_very_many_failures() -> None:
    """Thousands of failures never overflow or exceed the cap."""
    backoff = Backoff(base_s=0.05, cap_s=5.0, rng=random.Random(3))
    delays = [backoff.next_delay() for _ in range(5000)]
    assert all(2.5 <= d <= 5.0 for d in delays[20:])


def test_backoff_jitter_varies_delays_at_the_cap() -> None:
    """Delays at the cap are spread out, not one fixed value."""
    backoff = Backoff(base_s=1.0, cap_s=1.0, rng=random.Random(11))
    delays = [backoff.next_delay() for _ in range(200)]
    assert len({round(d, 6) for d in delays}) > 150
    assert min(delays) < 0.6 and max(delays) > 0.9  # covers most of [0.5, 1.0]


def test_backoff_reset_starts_again_from_the_base() -> None:
    """After reset the failure count is zero and the next delay is back in [base/2, base]."""
    backoff = Backoff(base_s=0.1, cap_s=10.0, rng=random.Random(5))
    for _ in range(10):
        backoff.next_delay()
    backoff.reset()
    assert backoff.failures == 0
    assert 0.05 <= backoff.next_delay() <= 0.1
    assert backoff.failures == 1


@pytest.mark.parametrize(("attempt", "nominal"), [(1, 1.0), (2, 2.0), (3, 4.0), (10, 512.0), (13, 3600.0),
                                                  (50, 3600.0), (0, 1.0), (-3, 1.0)])
def test_job_retry_delay_doubles_per_attempt_with_25_percent_jitter(attempt: int, nominal: float) -> None:
    """job_retry_delay is base * 2^(attempt-1), capped at an hour, within +-25%."""
    rng = random.Random(attempt)
    delays = [job_retry_delay(attempt, rng=rng) for _ in range(100)]
    assert all(0.75 * nominal <= d <= 1.25 * nominal for d in delays), (min(delays), max(delays))
    assert max(delays) - min(delays) > 0.25 * nominal  # jitter actually spreads them


def test_job_retry_delay_honours_base_and_cap() -> None:
    """A custom base and cap scale and bound the delay."""
    assert 7.5 <= job_retry_delay(1, base_s=10.0, cap_s=100.0) <= 12.5
    assert 75.0 <= job_retry_delay(30, base_s=10.0, cap_s=100.0) <= 125.0


def test_is_retryable_accepts_outages_and_transient_conflicts_only() -> None:
    """DatabaseUnavailable and transient StoreErrors retry; other errors do not."""
    transient = TransientConflict("deadlock")
    assert is_retryable(DatabaseUnavailable())
    assert is_retryable(transient)
    assert not is_retryable(StoreError("syntax error"))
    assert not is_retryable(ValueError("x"))


# --- config -------------------------------------------------------------------------------


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


# --- named queries ------------------------------------------------------------------------


def test_parse_queries_maps_names_to_stripped_sql() -> None:
    """Each ``-- name --`` block becomes one entry whose SQL runs to the next header."""
    text = "prelude ignored\n-- one --\n-- first\nSELECT 1;\n\n-- two_2 --\n-- second\nSELECT 2;\n"
    assert parse_queries(text) == {"one": "-- first\nSELECT 1;", "two_2": "-- second\nSELECT 2;"}


def test_parse_queries_rejects_a_duplicate_name() -> None:
    """A name used twice raises ValueError naming it."""
    with pytest.raises(ValueError, match="duplicate query name 'dup'"):
        parse_queries("-- dup --\nSELECT 1;\n-- other --\nSELECT 2;\n-- dup --\nSELECT 3;\n")


def test_every_query_used_by_the_store_exists_in_queries_sql() -> None:
    """Every ``query("name")`` in shardworker/store names a block of queries.sql."""
    store_dir = Path(shardworker.store.__file__).parent
    source = "".join(p.read_text(encoding="utf-8") for p in sorted(store_dir.glob("*.py")))
    used = set(re.findall(r"""query\(\s*["']([a-z0-9_]+)["']\s*\)""", source))
    assert len(used) >= 15  # the regex really finds the calls
    assert used - set(queries()) == set()


def test_every_query_block_has_a_description_and_sql() -> None:
    """Every block in queries.sql opens with a one-line ``--`` description followed by SQL."""
    for name, sql in queries().items():
        lines = sql.splitlines()
        assert lines[0].startswith("-- "), name
        assert any(line.strip() and not line.startswith("--") for line in lines), name


# --- wire format --------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", [
    Outcome.done(1, 1, b'{"bytes": 123}'),
    Outcome.retry(2**62, 25, "boom\nwith newline", 12.5),
    Outcome.failed(3, 2, "no retry"),
    Outcome.done(4, 1, b"null"),
])
def test_outcome_round_trips_through_wire_format(outcome: Outcome) -> None:
    """encode_outcome then decode_outcome give back an equal Outcome."""
    assert decode_outcome(encode_outcome(outcome)) == outcome


@pytest.mark.parametrize("garbage", [
    None, 42, "text", {"job_id": 1}, [], [1, 2, True, None, None], [1, 2, True, None, None, 0.0, "extra"],
    ["x", 1, True, None, None, 0.0], [1, 1, True, None, None, "soon"], [None, 1, True, None, None, 0.0],
])
def test_decode_outcome_rejects_garbage(garbage: object) -> None:
    """A value that is not a six-item outcome list with numeric id, attempt and delay raises."""
    with pytest.raises((ValueError, TypeError)):
        decode_outcome(orjson.dumps(garbage))


def test_an_outcome_record_carries_the_result_bytes_verbatim_after_a_fixed_header() -> None:
    """The result's JSON bytes appear in the record as they are, unescaped, at its end."""
    result = orjson.dumps({"text": 'quote " and \\ backslash', "n": [1, 2]})
    record = encode_outcome(Outcome.done(9, 3, result))
    assert record.endswith(result) and len(record) == 30 + len(result)
    assert outcome_key(record) == (9, 3)


def test_records_of_an_unreleased_earlier_format_are_refused() -> None:
    """Only the current record format decodes (the project was never released with another):
    a JSON-array record of the first development format is not an outcome."""
    old = orjson.dumps([5, 2, True, '{"a": 1}', None, 0.0])
    with pytest.raises(ValueError, match="not an outcome record"):
        decode_outcome(old)
    with pytest.raises(ValueError, match="not an outcome record"):
        outcome_key(old)


@pytest.mark.parametrize("cut", [1, 10, 29, 31])
def test_a_truncated_or_padded_record_is_refused(cut: int) -> None:
    record = encode_outcome(Outcome.done(1, 1, b'"abc"'))
    with pytest.raises(ValueError):
        decode_outcome(record[:cut] if cut < len(record) else record + b"x")
    with pytest.raises(ValueError):
        decode_outcome(record + b"\0")


def test_an_outcome_too_big_for_a_record_becomes_a_final_failure_saying_so() -> None:
    from outbox import MAX_RECORD_BYTES

    record = encode_outcome(Outcome.done(1, 1, b"1" * MAX_RECORD_BYTES))
    outcome = decode_outcome(record)
    assert (outcome.disposition, outcome.result_json) == (Disposition.FAILED, None)
    assert outcome.error is not None and "too large" in outcome.error


# --- handler registration and app loading -------------------------------------------------


def test_app_handler_registers_by_kind() -> None:
    """A decorated function is registered under its kind with its policy, and returned unchanged."""
    app = App()

    def fn(job: object) -> int:
        return 1

    assert app.handler("b.kind", max_attempts=3, timeout_s=2.0)(fn) is fn
    app.handler("a.kind")(fn)
    assert app.kinds == ["a.kind", "b.kind"]
    assert app.handlers["b.kind"].max_attempts == 3
    assert app.handlers["b.kind"].timeout_s == 2.0
    assert app.handlers["a.kind"].max_attempts is None


def test_app_handler_rejects_the_same_kind_twice() -> None:
    """Registering a second handler for a kind raises ConfigError naming the kind."""
    app = App()
    app.handler("dup")(lambda job: None)
    with pytest.raises(ConfigError, match="'dup' is registered twice"):
        app.handler("dup")(lambda job: None)


@pytest.mark.parametrize(("options", "message"), [
    ({"max_attempts": 0}, "max_attempts must be >= 1"),
    ({"timeout_s": 0}, "timeout_s must be a positive number"),
    ({"timeout_s": -1.5}, "timeout_s must be a positive number"),
])
def test_app_handler_rejects_bad_policy(options: dict[str, float], message: str) -> None:
    """A non-positive max_attempts or timeout raises ConfigError at decoration time."""
    with pytest.raises(ConfigError, match=message):
        App().handler("k", **options)  # type: ignore[arg-type]


@pytest.fixture
def app_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory on sys.path holding small modules for load_app."""
    (tmp_path / "sw_good_app.py").write_text(textwrap.dedent("""
        from shardworker import App
        app = App()
        other = App()
        not_an_app = 42
        empty = App()

        @app.handler("k")
        def k(job):
            return None

        @other.handler("o")
        def o(job):
            return None
    """))
    (tmp_path / "sw_broken_app.py").write_text("raise RuntimeError('broken on import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_load_app_returns_the_named_app(app_modules: Path) -> None:
    """MODULE loads ``app`` by default and MODULE:ATTR the named App."""
    assert load_app("sw_good_app").kinds == ["k"]
    assert load_app("sw_good_app:other").kinds == ["o"]


@pytest.mark.parametrize(("ref", "message"), [
    ("sw_no_such_module_xyz", "cannot import 'sw_no_such_module_xyz'"),
    ("sw_broken_app", "RuntimeError: broken on import"),
    ("sw_good_app:not_an_app", "sw_good_app:not_an_app is a int, not a shardworker App"),
    ("sw_good_app:missing", "module 'sw_good_app' has no attribute 'missing'"),
    ("sw_good_app:empty", "the App has no handlers"),
    (":app", "expected MODULE"),
])
def test_load_app_raises_app_load_error(app_modules: Path, ref: str, message: str) -> None:
    """A bad module, a failing import, or an attribute that is not an App with handlers raises AppLoadError."""
    with pytest.raises(AppLoadError) as info:
        load_app(ref)
    assert message in str(info.value)


# --- DSN redaction ------------------------------------------------------------------------


@pytest.mark.parametrize(("dsn", "expected"), [
    ("postgresql://alice:s3cret@db.example:5432/jobs", "postgresql://alice:***@db.example:5432/jobs"),
    ("postgres://:s3cret@localhost/jobs", "postgres://:***@localhost/jobs"),
    ("host=db user=alice password=s3cret dbname=jobs", "host=db user=alice password=*** dbname=jobs"),
    ("host=db password = 's3 cret' dbname=jobs", "host=db password = *** dbname=jobs"),
    ("host=db PASSWORD=s3cret", "host=db PASSWORD=***"),
    ("postgresql://db/jobs?user=alice&password=s3cret", None),
    ("postgresql://alice@db/jobs", "postgresql://alice@db/jobs"),
    ("host=db user=alice dbname=jobs", "host=db user=alice dbname=jobs"),
])
def test_redact_dsn_hides_passwords(dsn: str, expected: str | None) -> None:
    """redact_dsn removes the password from URL and key=value DSNs and leaves others untouched."""
    redacted = redact_dsn(dsn)
    assert "s3cret" not in redacted and "s3 cret" not in redacted
    if expected is not None:
        assert redacted == expected


# --- adaptive prefetch ---------------------------------------------------------------------


def _pool(clock: FakeClock, *, min_jobs: int = 65, max_jobs: int = 1001, horizon_s: float = 0.1):
    from shardworker.worker.pool import ChildPool
    from tests.helpers import child_config

    configs = [child_config(i, "/nonexistent") for i in range(2)]
    return ChildPool(configs, {}, min_jobs=min_jobs, max_jobs=max_jobs, max_bytes=1 << 20,
                     horizon_s=horizon_s, clock=clock)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_prefetch_target_starts_at_the_minimum_and_grows_with_a_childs_rate() -> None:
    clock = FakeClock()
    pool = _pool(clock)
    assert pool.target(0) == pool.target(1) == 65
    for _ in range(20):  # child 0 finishes 2,000 jobs/s for 5 s; child 1 nothing
        for _ in range(25):
            clock.now += 0.01
            pool.handles[0].pace.finished(20, clock.now)
    assert pool.target(1) == 65
    assert 65 + 150 <= pool.target(0) <= 65 + 200  # about 0.1 s of 2,000/s on top of the minimum


def test_prefetch_target_is_capped_and_decays_to_the_minimum_when_a_child_stalls() -> None:
    clock = FakeClock()
    pool = _pool(clock)
    for _ in range(400):  # 100,000 jobs/s: far over the cap
        clock.now += 0.01
        pool.handles[0].pace.finished(1000, clock.now)
    assert pool.target(0) == 1001
    targets = []
    for _ in range(12):  # a slow handler: nothing finishes for 3 s
        clock.now += 0.25
        targets.append(pool.target(0))
    assert targets == sorted(targets, reverse=True)
    assert targets[-1] <= 65 + 5


def test_worker_config_prefetch_jobs_is_concurrency_plus_batch_up_to_max() -> None:
    config = WorkerConfig(app_ref="a:b", dsn="postgresql://x/y", concurrency=100, prefetch_batch=64,
                          prefetch_max_jobs=1000)
    assert config.prefetch_jobs(False) == (65, 1001)
    assert config.prefetch_jobs(True) == (164, 1100)
