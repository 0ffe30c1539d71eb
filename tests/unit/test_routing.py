"""Unit tests of ``shardworker.core.routing``: ``shard_for`` against a pinned table, stable across
processes and hash seeds, spreading ids evenly."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shardworker.core.routing import _mix64, shard_for

REPO = Path(__file__).resolve().parents[2]

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
        from shardworker.core.routing import shard_for
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
