"""outbox: a local, fsync'd, crash-safe log of records, one writer per shard.

It imports nothing from ``shardworker`` and never touches a database.

* ``ShardWriter.open(dir, shard)``: the only writer of a shard; ``append`` then ``commit``
  (one write, one fdatasync: a group commit). Records are acknowledged when ``commit``
  returns.
* ``OutboxReader.open(dir)``: the one flusher of a directory; ``poll``, then
  ``mark_flushed`` once the records are committed elsewhere, then ``checkpoint``.
* ``status(dir)``, ``verify(dir)``, ``records_since(dir, shard, t)``, ``pending_records(dir)``
  and ``kept_records(dir)``: read-only inspection, no lock needed.
* ``Keep(seconds, max_bytes, min_free_bytes)``: the applied tail a reader keeps, for applying
  again (``OutboxReader.rewind``) what the place it was applied to lost (``outbox.tail``).
* ``free_bytes(dir)``: for a free-space watermark checked before taking on work that will
  need the outbox. ``MAX_RECORD_BYTES``: the largest record a writer accepts.

Trust: a directory (and ``torn/``, ``quarantine/``) must be owned by the process's effective
user, must not be a symlink, and must not be writable by other users, or every entry point
refuses it with ``OutboxUntrusted``; the reader also refuses it while any file in it is
another account's; no file in it is opened through a symlink.

Layout of a directory (0700; files 0600)::

    shard-0003.lock                 writer lock of shard 3 (flock)
    shard-0003-0000000007.seg       segment 7 of shard 3
    flusher.lock                    the flusher lock (flock)
    checkpoint.json                 the flusher's positions (a hint), and its caller's note
    torn/                           torn tails cut off by recovery, kept for inspection
    quarantine/                     corrupt segments, moved aside and reported
"""

from outbox.checkpoint import Position
from outbox.errors import (
    OutboxCorrupt,
    OutboxError,
    OutboxFull,
    OutboxLocked,
    OutboxSyncError,
    OutboxUnserializable,
    OutboxUntrusted,
)
from outbox.frame import MAX_PAYLOAD_BYTES as MAX_RECORD_BYTES
from outbox.fsutil import free_bytes
from outbox.inspect import (
    OutboxStatus,
    ShardStatus,
    VerifyReport,
    kept_records,
    pending_records,
    records_since,
    status,
    verify,
)
from outbox.reader import OutboxReader, Record
from outbox.recovery import RecoveryEvent
from outbox.tail import Keep
from outbox.writer import ShardWriter, WriterConfig

__all__ = [
    "MAX_RECORD_BYTES", "Keep", "OutboxCorrupt", "OutboxError", "OutboxFull", "OutboxLocked", "OutboxReader",
    "OutboxStatus", "OutboxSyncError", "OutboxUnserializable", "OutboxUntrusted", "Position", "Record",
    "RecoveryEvent", "ShardStatus", "ShardWriter", "VerifyReport", "WriterConfig", "free_bytes", "kept_records",
    "pending_records", "records_since", "status", "verify",
]
