"""The names shardworker keeps inside an outbox directory, beside the outbox package's own.

The ``outbox`` package owns its segments, shard locks, ``flusher.lock``, the checkpoint,
``torn/`` and ``quarantine/``. shardworker adds::

    worker.lock      held (flock) by the worker running on this directory, or a drain;
                     holds {"pid", "role"} of the holder, for the refusal of a second one
    worker-id        the id the worker last ran under (the default for --worker-id)
    outbox-id        this outbox's own id, made at first use: its mark in the database is kept
                     under it (``shardworker.flusher.marks``), whatever --worker-id says
    shard-9999-*     the parent's own shard: outcomes it decides for dead children
    database.json    the database this outbox is bound to (its instance id and name)
    deadletter/      outcomes the database refused for good, kept whole
    stale.jsonl      outcomes whose job a newer attempt owns (rescued, or cancelled and retried), kept whole
    setaside.jsonl   outcomes whose job does not exist in the database, kept whole
    lost.jsonl       jobs requeued because their outcome was in a quarantined segment
    followups.jsonl  the ids follow-up jobs got, for inserting them again with those ids after the
                     database went back in time (``shardworker.flusher.journal``)
    giveback.json    jobs a stop could not give back (database away): never started, so the
                     next start or drain releases them without charging an attempt
    progress-<shard>.bin  a child's progress slots, mapped by the parent and the child
                     (``shardworker.child.progress``): which jobs' handlers started
    progress-boot    the boot id of the host when the progress files were made: they are
                     trusted at the next start only in that same boot
    started.json     the jobs the last start found started (or that nothing could be
                     trusted), kept until its recovery has charged them

Everything that opens, locks or counts one of these names comes through here, and opens
nothing through a symlink (the directory itself is checked by ``outbox.ensure_dir``:
owned by this user, no symlink).
"""

from __future__ import annotations

import os
import socket
import uuid

import orjson

from outbox import (
    CHECKPOINT_NAME,
    FLUSHER_LOCK,
    NOFOLLOW,
    QUARANTINE_DIR,
    TORN_DIR,
    WAKE_SOCKET,
    atomic_write,
    ensure_dir,
    fsync_dir,
    read_small,
    try_lock,
)
from shardworker.errors import OutboxBusy, ShardworkerError

WORKER_LOCK = "worker.lock"
WORKER_ID_FILE = "worker-id"
OUTBOX_ID_FILE = "outbox-id"
DEADLETTER_DIR = "deadletter"
STALE_LOG = "stale.jsonl"
SETASIDE_LOG = "setaside.jsonl"
LOST_LOG = "lost.jsonl"
DATABASE_FILE = "database.json"
GIVEBACK_FILE = "giveback.json"
FOLLOWUPS_JOURNAL = "followups.jsonl"
PROGRESS_BOOT = "progress-boot"  # the boot and the children count of the progress-<shard>.bin files
STARTED_FILE = "started.json"  # the jobs the last run's children started, until the next recovery is over
PARENT_SHARD = 9999  # above any child's shard: --procs is capped below it
# An outbox's names, the outbox package's and ours (not_an_outbox): any one of them makes it an outbox.
_OUTBOX_PREFIXES = ("shard-", "progress-")
_OUTBOX_NAMES = {WORKER_LOCK, WORKER_ID_FILE, OUTBOX_ID_FILE, DEADLETTER_DIR, STALE_LOG, SETASIDE_LOG, LOST_LOG, DATABASE_FILE,
                 GIVEBACK_FILE, FOLLOWUPS_JOURNAL, STARTED_FILE, FLUSHER_LOCK, CHECKPOINT_NAME, WAKE_SOCKET, TORN_DIR, QUARANTINE_DIR}


# What to do when the outbox is in use, by (holder, the one refused): "worker" or "drain".
_IN_USE_ADVICE = {
    ("worker", "worker"): "give each worker an --outbox-dir of its own, or stop that one first",
    ("worker", "drain"): "a running worker applies its outbox itself: drain it once that worker has stopped",
    ("drain", "worker"): "start the worker once the drain has ended",
    ("drain", "drain"): "wait for that drain to end",
    ("worker", "reapply"): "a running worker re-applies by itself what a database that went back lost: run "
                           "`outbox reapply` only with the worker stopped",
    ("drain", "reapply"): "wait for that drain to end",
    ("reapply", "worker"): "start the worker once `outbox reapply` has ended",
    ("reapply", "drain"): "wait for `outbox reapply` to end",
    ("reapply", "reapply"): "wait for that `outbox reapply` to end",
}
_HOLDERS = {"worker": "a worker", "drain": "`outbox drain`", "reapply": "`outbox reapply`"}


def lock_outbox(directory: str, role: str) -> int:
    """Take the directory's worker lock (held for the worker's or drain's life, ``role`` being
    which) and write our pid and role in it; ``OutboxBusy`` naming the holder's if held. A
    directory holding files and none of an outbox's is refused untouched (``not_an_outbox``)."""
    not_an_outbox(directory)
    ensure_dir(directory)
    path = os.path.join(directory, WORKER_LOCK)
    fd = try_lock(path)
    if fd is None:
        raise OutboxBusy(_in_use(directory, path, role))
    os.ftruncate(fd, 0)
    os.pwrite(fd, orjson.dumps({"pid": os.getpid(), "role": role}), 0)
    return fd


def not_an_outbox(directory: str) -> None:
    """Refuse an existing directory that holds files and nothing an outbox or a worker writes
    (a folder of the user's, named by mistake): taking it would make it 0700 and add ours."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return  # made at first use (ensure_dir says what is wrong with a file of that name)
    if not names or any(name.startswith(_OUTBOX_PREFIXES) or name in _OUTBOX_NAMES for name in names):
        return
    shown = ", ".join(sorted(names)[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    raise ShardworkerError(f"--outbox-dir {directory} holds files that are not an outbox's ({shown}): "
                           "give a new or empty directory (an outbox is made 0700 for the results it keeps)")


def _in_use(directory: str, path: str, role: str) -> str:
    """The refusal: who holds the outbox (its pid, from the lock file) and what to do."""
    try:
        holder = orjson.loads(read_small(path))
        pid, held_by = int(holder["pid"]), str(holder["role"])
    except (OSError, ValueError, TypeError, KeyError):  # written by a version before pids, or just being written
        pid, held_by = None, ""
    who = f"{_HOLDERS[held_by]} (pid {pid})" if held_by in _HOLDERS else "another worker or `outbox drain`"
    return f"--outbox-dir {directory} is in use by {who}; {_IN_USE_ADVICE[held_by or 'worker', role]}"


def resolve_worker_id(directory: str, given: str | None) -> str:
    """``given``, else the id stored in the outbox directory, else a new one. The id used is
    stored either way: ``outbox drain`` heartbeats under it, so the jobs whose outcomes it
    applies are not rescued from under it."""
    stored = read_worker_id(directory)
    chosen = given or stored or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
    if chosen != stored:
        atomic_write(directory, WORKER_ID_FILE, chosen.encode())
    return chosen


def read_outbox_id(directory: str) -> str:
    """This outbox's own id; "" before its first flusher made one."""
    try:
        return read_small(os.path.join(directory, OUTBOX_ID_FILE)).decode("ascii", errors="replace").strip()
    except FileNotFoundError:
        return ""


def holds_an_outbox(directory: str) -> bool:
    """Whether ``directory`` holds an outbox a worker used (its id, or segments)."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return OUTBOX_ID_FILE in names or any(name.startswith("shard-") and name.endswith(".seg") for name in names)


def outbox_id(directory: str) -> str:
    """This outbox's own id (``outbox-id``), made at first use: it names the outbox's mark in
    the database, and stays whatever worker id runs on the directory."""
    found = read_outbox_id(directory)
    if found:
        return found
    made = uuid.uuid4().hex
    atomic_write(directory, OUTBOX_ID_FILE, made.encode())
    return made


def read_worker_id(directory: str) -> str:
    """The worker id stored in ``directory``; "" before the first run."""
    try:
        return read_small(os.path.join(directory, WORKER_ID_FILE)).decode("utf-8", errors="replace").strip()
    except FileNotFoundError:
        return ""


def deadletter_dir(directory: str) -> str:
    return os.path.join(directory, DEADLETTER_DIR)


def stale_log(directory: str) -> str:
    return os.path.join(directory, STALE_LOG)


def setaside_log(directory: str) -> str:
    return os.path.join(directory, SETASIDE_LOG)


def lost_log(directory: str) -> str:
    return os.path.join(directory, LOST_LOG)


def count_deadlettered(directory: str) -> int:
    path = deadletter_dir(directory)
    return len(os.listdir(path)) if os.path.isdir(path) else 0


def count_lines(path: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW)
    except FileNotFoundError:
        return 0
    with open(fd, "rb") as f:
        return sum(1 for _ in f)


def count_stale(directory: str) -> int:
    return count_lines(stale_log(directory)) + count_lines(os.path.join(directory, "stale.log"))  # + before 0.2


CANCELLED_REASON = "cancelled while it ran"  # the reason of an outcome kept in stale.jsonl because of a cancel


def count_cancelled_kept(directory: str) -> int:
    """Of the outcomes ``count_stale`` counts, those kept because their job was cancelled."""
    marker = b'"reason":"' + CANCELLED_REASON.encode() + b'"'
    try:
        fd = os.open(stale_log(directory), os.O_RDONLY | NOFOLLOW)
    except FileNotFoundError:
        return 0
    with open(fd, "rb") as f:
        return sum(1 for line in f if marker in line)


def count_setaside(directory: str) -> int:
    return count_lines(setaside_log(directory))


def shard_lock_names(directory: str) -> list[str]:
    """Paths of the shard writer locks present in ``directory`` (live or left behind)."""
    return sorted(os.path.join(directory, name) for name in os.listdir(directory)
                  if name.startswith("shard-") and name.endswith(".lock"))


def progress_path(directory: str, shard: int) -> str:
    return os.path.join(directory, f"progress-{shard}.bin")


def progress_names(directory: str) -> list[str]:
    """Paths of the progress files in ``directory``, of any shard."""
    return sorted(os.path.join(directory, name) for name in os.listdir(directory)
                  if name.startswith("progress-") and name.endswith(".bin"))


# Jobs to give back: {worker id: {"jobs": [[id, attempt], ...], "claims": [token, ...]}}.
GiveBack = dict[str, dict[str, list]]


def read_giveback(directory: str) -> GiveBack:
    """What ``giveback.json`` holds (empty when there is none)."""
    path = os.path.join(directory, GIVEBACK_FILE)
    try:
        data = orjson.loads(read_small(path))
        return {str(w): {"jobs": [[int(j), int(a)] for j, a in entry["jobs"]],
                         "claims": [str(t) for t in entry["claims"]]}
                for w, entry in data["workers"].items()}
    except FileNotFoundError:
        return {}
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        # Written atomically, so only a hand edit gets here; removing it charges those jobs.
        raise ShardworkerError(f"{path} is unreadable ({exc}); fix or remove it (its jobs are then "
                         "requeued as orphans, each charged an attempt)") from exc


def save_giveback(directory: str, worker_id: str, jobs: list[tuple[int, int]], claims: list[str]) -> None:
    """Add ``jobs`` (id, attempt) and claim tokens to ``giveback.json``, durably; what the file
    already held is kept (a second stop in the same outage adds to the first's list)."""
    held = read_giveback(directory)
    entry = held.setdefault(worker_id, {"jobs": [], "claims": []})
    entry["jobs"] = sorted({(j, a) for j, a in entry["jobs"]} | {(j, a) for j, a in jobs})
    entry["claims"] = sorted(set(entry["claims"]) | set(claims))
    atomic_write(directory, GIVEBACK_FILE, orjson.dumps({"version": 1, "workers": held}))


def remove_giveback(directory: str) -> None:
    """Remove ``giveback.json`` once everything in it was given back (durably)."""
    try:
        os.unlink(os.path.join(directory, GIVEBACK_FILE))
    except FileNotFoundError:
        return
    fsync_dir(directory)


def count_giveback(directory: str) -> tuple[int, int]:
    """(jobs, claims) waiting in ``giveback.json`` to be given back."""
    held = read_giveback(directory).values()
    return sum(len(e["jobs"]) for e in held), sum(len(e["claims"]) for e in held)
