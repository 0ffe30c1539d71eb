"""Which jobs the last run's children had started, read at the next start.

A kill -9 of the whole worker leaves its claimed jobs ``running``: those a child held but
never started ran nothing and go back uncharged, the others are charged an attempt
(``shardworker.worker.startup``). The children's progress slots tell them apart: they live in
``progress-<shard>.bin`` (``shardworker.child.progress``) and hold every job whose handler
started and whose outcome may not be durable. A write to them reaches the page cache, not
the disk, so they are trusted only in the boot that wrote them (``progress-boot`` holds its
id and how many children the run had); a missing or unreadable file, or one of the wrong
size, trusts nothing: every orphan is charged, as when no progress file existed. Before
the new children rewrite the files, ``take_previous`` keeps what it read in ``started.json``
(fsync'd) until the recovery that uses it is over (``recovered``): a start that dies first
leaves it to the next one.
"""

from __future__ import annotations

import contextlib
import logging
import os

import orjson

from outbox import atomic_write, fsync_dir, read_small
from shardworker.child.progress import read_started
from shardworker.core import layout

log = logging.getLogger(__name__)

BOOT_ID = "/proc/sys/kernel/random/boot_id"

Started = frozenset[int] | None  # None: nothing can be trusted, every orphan is charged


def take_previous(directory: str, shards: int) -> Started:
    """Before the children start: the ids of the jobs the earlier runs' children started
    (kept in ``started.json``), then a fresh start for this run's ``shards`` progress files."""
    found = previous(directory)
    try:
        if found or found is None or os.path.exists(os.path.join(directory, layout.STARTED_FILE)):
            ids = None if found is None else sorted(found)
            atomic_write(directory, layout.STARTED_FILE, orjson.dumps({"version": 1, "ids": ids}))
        for path in layout.progress_names(directory):
            os.unlink(path)
        boot = boot_id()
        if boot and _read_boot(directory) != f"{boot}\n{shards}\n":
            atomic_write(directory, layout.PROGRESS_BOOT, f"{boot}\n{shards}\n".encode())
    except OSError as exc:
        # Without started.json this run's files would hide what earlier runs started: trust none.
        log.warning("could not keep which jobs the last run started (%s); its running jobs are charged", exc)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, layout.PROGRESS_BOOT))
        return None
    return found


def recovered(directory: str) -> None:
    """The recovery that used ``take_previous``'s answer is over: forget it."""
    try:
        os.unlink(os.path.join(directory, layout.STARTED_FILE))
        fsync_dir(directory)
    except FileNotFoundError:
        return
    except OSError as exc:  # kept, it only charges more at the next start
        log.warning("could not remove %s (%s)", layout.STARTED_FILE, exc)


def previous(directory: str) -> Started:
    """The ids of the jobs earlier runs' children started (None: not known), files untouched."""
    kept = _read_kept(directory)
    progress = read_progress(directory)
    return None if kept is None or progress is None else kept | progress


def read_progress(directory: str) -> Started:
    """The job ids in the progress files of ``directory``; None unless ``progress-boot``
    names this boot and every file of the children it counts is there and whole."""
    boot, written = boot_id(), _read_boot(directory).split("\n")
    if not boot or written[0] != boot or len(written) < 2 or not written[1].isdigit():
        if written[0]:
            log.info("the progress files are of another boot: the jobs the last run left running are charged")
        return None
    paths = {layout.progress_path(directory, shard) for shard in range(int(written[1]))}
    ids: set[int] = set()
    try:
        for path in sorted(paths | set(layout.progress_names(directory))):
            ids |= read_started(path)
    except (OSError, ValueError) as exc:
        log.warning("unreadable progress file (%s): the jobs the last run left running are charged", exc)
        return None
    return frozenset(ids)


def _read_kept(directory: str) -> Started:
    """What ``started.json`` holds: empty when absent, None when it says nothing can be
    trusted or cannot be read."""
    try:
        ids = orjson.loads(read_small(os.path.join(directory, layout.STARTED_FILE)))["ids"]
        return None if ids is None else frozenset(int(i) for i in ids)
    except FileNotFoundError:
        return frozenset()
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _read_boot(directory: str) -> str:
    try:
        return read_small(os.path.join(directory, layout.PROGRESS_BOOT)).decode(errors="replace")
    except OSError:
        return ""


def boot_id() -> str:
    """This boot's id ("" where the system does not say)."""
    try:
        return read_small(BOOT_ID).decode().strip()
    except OSError:
        return ""
