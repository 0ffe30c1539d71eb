"""Errors raised by the outbox.

Hierarchy::

    OutboxError
    ├── OutboxLocked        another process holds a writer or the flusher lock
    ├── OutboxFull          a write came up short or hit ENOSPC; nothing was acknowledged
    ├── OutboxSyncError     fdatasync failed; the segment is abandoned, nothing acknowledged
    ├── OutboxCorrupt       a segment holds damage followed by valid data; it was quarantined
    ├── OutboxUnserializable  a value orjson cannot encode; nothing was written
    └── OutboxUntrusted     the directory is a symlink or another user's; nothing was touched

Each class's docstring is its default message.
"""

from __future__ import annotations


class OutboxError(Exception):
    """Outbox error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class OutboxLocked(OutboxError):
    """Another process holds this outbox lock."""


class OutboxFull(OutboxError):
    """The outbox disk is full; the batch was not acknowledged."""


class OutboxSyncError(OutboxError):
    """fdatasync failed; the segment was abandoned and the batch not acknowledged."""


class OutboxCorrupt(OutboxError):
    """An outbox segment is corrupt and was quarantined."""


class OutboxUnserializable(OutboxError):
    """The value cannot be serialized to JSON."""


class OutboxUntrusted(OutboxError):
    """The outbox directory is a symlink or is owned by another user; it was not used."""
