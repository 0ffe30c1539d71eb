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
* The file recipes the outbox trusts, for the small files that live beside it:
  ``ensure_dir`` (make or check a 0700 directory of ours), ``atomic_write`` (tmp, fsync,
  rename, fsync the directory), ``append_durably``, ``read_small`` (no symlink, a bounded
  read), ``fsync_dir``, ``try_lock`` and ``is_locked`` (flock), ``FILE_MODE`` and
  ``NOFOLLOW``; and the names the outbox gives its own files (``CHECKPOINT_NAME``,
  ``FLUSHER_LOCK``, ``TORN_DIR``, ``QUARANTINE_DIR``, ``WAKE_SOCKET``), so that a caller
  keeping files beside it can tell them apart.

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

from outbox.checkpoint import CHECKPOINT_NAME, Position
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
from outbox.fsutil import (
    FILE_MODE,
    NOFOLLOW,
    append_durably,
    atomic_write,
    ensure_dir,
    free_bytes,
    fsync_dir,
    is_locked,
    read_small,
    try_lock,
)
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
from outbox.reader import FLUSHER_LOCK, OutboxReader, Record
from outbox.recovery import QUARANTINE_DIR, TORN_DIR, RecoveryEvent
from outbox.tail import Keep
from outbox.wake import WAKE_SOCKET
from outbox.writer import ShardWriter, WriterConfig

__all__ = [
    "CHECKPOINT_NAME", "FILE_MODE", "FLUSHER_LOCK", "MAX_RECORD_BYTES", "NOFOLLOW", "QUARANTINE_DIR", "TORN_DIR",
    "WAKE_SOCKET", "Keep", "OutboxCorrupt", "OutboxError", "OutboxFull", "OutboxLocked", "OutboxReader",
    "OutboxStatus", "OutboxSyncError", "OutboxUnserializable", "OutboxUntrusted", "Position", "Record",
    "RecoveryEvent", "ShardStatus", "ShardWriter", "VerifyReport", "WriterConfig", "append_durably", "atomic_write",
    "ensure_dir", "free_bytes", "fsync_dir", "is_locked", "kept_records", "pending_records", "read_small",
    "records_since", "status", "try_lock", "verify",
]
