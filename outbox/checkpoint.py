"""The flusher's durable checkpoint: per shard, the first record not yet flushed.

The checkpoint is only a hint: the database decides what was applied. Losing it (or an
older copy surviving a crash) replays records, and replays must be harmless.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import orjson

from outbox import fsutil

CHECKPOINT_NAME = "checkpoint.json"


@dataclass(frozen=True, order=True)
class Position:
    """A place in a shard's log: segment number, byte offset, next sequence number."""

    segno: int
    offset: int
    seq: int


def load(directory: str) -> dict[int, Position]:
    """The saved positions, or an empty map when there is no checkpoint yet."""
    path = os.path.join(directory, CHECKPOINT_NAME)
    try:
        doc = orjson.loads(fsutil.read_small(path))
    except FileNotFoundError:
        return {}
    except orjson.JSONDecodeError:
        # A damaged hint costs a replay from the oldest segment, never data.
        return {}
    try:
        return {int(k): Position(*map(int, v)) for k, v in doc["shards"].items()}
    except (AttributeError, KeyError, TypeError, ValueError):
        return {}  # valid JSON of another shape: as damaged


def load_note(directory: str) -> dict[str, object]:
    """The note the flusher saved with its positions (what its caller keeps there); {} when none."""
    try:
        doc = orjson.loads(fsutil.read_small(os.path.join(directory, CHECKPOINT_NAME)))
    except (FileNotFoundError, orjson.JSONDecodeError):
        return {}
    note = doc.get("note") if isinstance(doc, dict) else None
    return note if isinstance(note, dict) else {}


def save(directory: str, positions: dict[int, Position], note: dict[str, object] | None = None) -> None:
    """Durably replace the checkpoint (tmp, fsync, rename, fsync dir), with the caller's ``note``."""
    doc: dict[str, object] = {"version": 1,
                              "shards": {str(k): [p.segno, p.offset, p.seq] for k, p in positions.items()}}
    if note:
        doc["note"] = note
    fsutil.atomic_write(directory, CHECKPOINT_NAME, orjson.dumps(doc))
