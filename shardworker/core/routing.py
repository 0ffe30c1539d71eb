"""Stable routing of job ids to child processes: a job's home child.

The hash picks the child a job is sent to first; a saturated child's jobs run elsewhere
(``shardworker.worker.sending``: a child with room takes what its home child cannot start).

Python's ``hash()`` is salted per process for str and, while stable for ints, is the
identity for small ints (so ids would stripe, not spread). We mix the id with the
SplitMix64 finalizer instead: stable across processes, versions and hosts, cheap, and
uniform over consecutive ids.
"""

from __future__ import annotations

_MASK = (1 << 64) - 1


def _mix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def shard_for(job_id: int, shards: int) -> int:
    """The home child (0 .. shards-1) of ``job_id``; always the same for the same inputs."""
    if shards < 1:
        raise ValueError("shards must be >= 1")
    return _mix64(job_id & _MASK) % shards
