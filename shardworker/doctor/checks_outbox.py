"""The outbox directory's checks for ``shardworker doctor``: ``gather_outbox`` reads the facts
(modes, owners, free space, pending records, the worker lock and the binding; no lock taken,
nothing written) and the ``check_*`` functions judge them. They need no database."""

from __future__ import annotations

import os
import pwd
import shlex
import stat
from dataclasses import dataclass, field

import outbox
from outbox import checkpoint, is_locked
from shardworker.core import binding, layout
from shardworker.core.binding import Binding
from shardworker.doctor.report import Check, Status, attempt

MiB = 1024 * 1024
PENDING_AGE_WARN_S = 60.0  # a running worker's flusher applies outcomes within milliseconds


@dataclass(frozen=True)
class OutboxFacts:
    """What the outbox directory holds; ``exists`` False leaves the rest at their defaults."""

    directory: str
    exists: bool
    owner: int = -1
    too_open: list[tuple[str, int]] = field(default_factory=list)  # (path relative to it, mode)
    foreign: list[tuple[str, int]] = field(default_factory=list)  # (path relative to it, owner uid)
    free_bytes: int = 0
    status: outbox.OutboxStatus | None = None
    worker_running: bool = False
    bound: Binding | None = None
    binding_error: str | None = None
    symlink_to: str | None = None  # the directory is a symlink (to this): the worker refuses it
    outbox_id: str = ""  # its own id, under which the database keeps its mark ("" before its first batch)
    applied_batch: int = 0  # the batches its flusher saw committed, as its last checkpoint says


def gather_outbox(directory: str, me: int | None = None) -> OutboxFacts:
    """Read the directory: modes and owners of everything in it, free space, pending records,
    the worker lock (a probe, never held) and the binding. No lock taken, nothing written.
    A symlink, or a directory another user owns, is not read further (the worker refuses it)."""
    me = os.geteuid() if me is None else me
    if not os.path.lexists(directory):
        return OutboxFacts(directory, False)
    if os.path.islink(directory):
        return OutboxFacts(directory, True, os.lstat(directory).st_uid, symlink_to=os.readlink(directory))
    if not os.path.isdir(directory):
        return OutboxFacts(directory, False)
    owner = os.stat(directory).st_uid
    if owner != me:
        return OutboxFacts(directory, True, owner, free_bytes=outbox.free_bytes(directory))
    too_open: list[tuple[str, int]] = []
    foreign: list[tuple[str, int]] = []
    for path, st in _walk(directory):
        rel = directory if path == directory else os.path.relpath(path, directory)
        if stat.S_IMODE(st.st_mode) & 0o077:
            too_open.append((rel, stat.S_IMODE(st.st_mode)))
        if st.st_uid != owner:
            foreign.append((rel, st.st_uid))
    bound, binding_error = attempt(lambda: binding.bound_to(directory))
    ident, note = layout.read_outbox_id(directory), checkpoint.load_note(directory)
    applied = note.get("batch") if note.get("outbox") == ident else 0
    return OutboxFacts(directory, True, owner, too_open, foreign, outbox.free_bytes(directory),
                       outbox.status(directory), is_locked(os.path.join(directory, layout.WORKER_LOCK)),
                       bound, binding_error, outbox_id=ident, applied_batch=applied if isinstance(applied, int) else 0)


def _walk(directory: str) -> list[tuple[str, os.stat_result]]:
    """Every entry under ``directory`` and itself, links not followed."""
    found = [(directory, os.lstat(directory))]
    for root, dirs, files in os.walk(directory):
        found += [(os.path.join(root, name), os.lstat(os.path.join(root, name))) for name in dirs + files]
    return found


def check_outbox_dir(facts: OutboxFacts, given: bool) -> Check:
    """A missing directory is fine (nothing pending) unless the user named it: then it is a typo
    or the wrong host."""
    if not facts.exists:
        if given:
            return Check("outbox", Status.FAIL, f"no outbox directory at {facts.directory}",
                         "check --outbox-dir (SHARDWORKER_OUTBOX_DIR): it must be the worker's", {"exists": False})
        return Check("outbox", Status.OK, f"no outbox directory at {facts.directory} (nothing pending)", None,
                     {"exists": False})
    return Check("outbox", Status.OK, f"directory {facts.directory}", None, {"exists": True})


def check_permissions(facts: OutboxFacts, me: int | None = None) -> Check:
    """Owned by you and no symlink (the worker refuses anything else), directories 0700 and
    files 0600 (outcomes hold job results), all of one owner. Advice never hands the directory
    or anything in it to another user: whoever owns it could plant outcomes the flusher applies."""
    me = os.geteuid() if me is None else me
    quoted = shlex.quote(facts.directory)
    data = {"owner": _user(facts.owner), "too_open": [p for p, _ in facts.too_open],
            "foreign": [p for p, _ in facts.foreign]}
    aside = (f"move it aside (`mv {quoted} {shlex.quote(facts.directory + '.untrusted')}`), check what is in it, "
             "and let the worker create a new one; never chown it to another user")
    if facts.symlink_to is not None:
        return Check("modes", Status.FAIL, f"{facts.directory} is a symlink to {facts.symlink_to}: the worker "
                     "refuses an outbox directory reached through a symlink",
                     "point --outbox-dir at a real directory owned by the user the worker runs as", data)
    if facts.owner != me:
        return Check("modes", Status.FAIL, f"owned by {_user(facts.owner)}, not by you ({_user(me)}): a worker or "
                     "drain run as you refuses it", "run doctor as the user the worker runs as; if that is you, "
                     f"another user created this directory: {aside}", data)
    if facts.too_open:
        listed = ", ".join(f"{p} ({m:04o})" for p, m in facts.too_open[:3])
        more = f" and {len(facts.too_open) - 3} more" if len(facts.too_open) > 3 else ""
        return Check("modes", Status.FAIL, f"open to other users: {listed}{more} (directories must be 0700, "
                     f"files 0600)", f"run `chmod -R go= {quoted}`", data)
    if facts.foreign:
        listed = ", ".join(f"{p} ({_user(uid)})" for p, uid in facts.foreign[:3])
        return Check("modes", Status.FAIL, f"not owned by the directory's owner {_user(facts.owner)}: {listed}",
                     f"run `chown -R {_user(me)} {quoted}` as root once you have checked them (and run the "
                     f"worker and drain as {_user(me)})", data)
    return Check("modes", Status.OK, f"0700/0600, owned by {_user(facts.owner)}", None, data)


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def check_free_space(facts: OutboxFacts, min_free_bytes: int) -> Check:
    """The worker stops claiming below its --min-free-mb; warn within twice that."""
    free_mb, floor_mb = facts.free_bytes / MiB, min_free_bytes / MiB
    data = {"free_bytes": facts.free_bytes, "min_free_bytes": min_free_bytes}
    if facts.free_bytes < min_free_bytes:
        return Check("disk", Status.FAIL, f"{free_mb:.0f} MiB free, under --min-free-mb {floor_mb:.0f}: the worker "
                     "claims nothing", "free space on the outbox's file system", data)
    if facts.free_bytes < 2 * min_free_bytes:
        return Check("disk", Status.WARN, f"{free_mb:.0f} MiB free, near --min-free-mb {floor_mb:.0f}",
                     "free space on the outbox's file system before the worker stops claiming", data)
    return Check("disk", Status.OK, f"{free_mb:.0f} MiB free (--min-free-mb {floor_mb:.0f})", None, data)


def check_pending(facts: OutboxFacts, age_warn_s: float = PENDING_AGE_WARN_S) -> Check:
    """Outcomes waiting in the outbox; with no worker (or drain) on the directory, nobody applies them."""
    assert facts.status is not None
    shards = facts.status.shards
    count, nbytes = facts.status.pending, sum(s.pending_bytes for s in shards)
    ages = [s.oldest_age_s for s in shards if s.oldest_age_s is not None]
    oldest = max(ages, default=None)
    data = {"pending": count, "bytes": nbytes, "oldest_age_s": oldest, "worker_running": facts.worker_running}
    if not count:
        return Check("pending", Status.OK, "no outcomes pending", None, data)
    text = f"{count} outcome(s) pending ({nbytes} bytes, oldest {oldest or 0:.0f} s)"
    if not facts.worker_running:
        return Check("pending", Status.FAIL, f"{text} and no worker running on it",
                     f"run `shardworker outbox drain --outbox-dir {shlex.quote(facts.directory)}` with the --dsn "
                     "it belongs to, or start the worker", data)
    if oldest is not None and oldest > age_warn_s:
        return Check("pending", Status.WARN, f"{text}; a worker runs but they wait",
                     "check that the worker reaches its database (its log says why it waits)", data)
    return Check("pending", Status.OK, f"{text}; a worker is applying them", None, data)


def check_binding(facts: OutboxFacts, here: Binding | None, reachable: bool) -> Check:
    """The database the outbox belongs to, against the one --dsn reaches."""
    if facts.binding_error is not None:
        return Check("bound-to", Status.FAIL, facts.binding_error, "restore database.json", {"bound": None})
    bound = facts.bound
    if bound is None:
        return Check("bound-to", Status.OK, "no database yet (a worker records its database at first start)", None,
                     {"bound": None})
    data = {"bound": {"instance": bound.instance, "database": bound.database, "server": bound.server},
            "matches": None if here is None else bound.same_database(here)}
    if here is None:
        if not reachable:
            return Check("bound-to", Status.WARN, f"{bound.describe()}; not compared (database unreachable)",
                         "run doctor again once the database is back", data)
        return Check("bound-to", Status.WARN, f"{bound.describe()}; not compared (no shardworker schema there)",
                     "run `shardworker migrate` if --dsn is the right database", data)
    if not bound.same_database(here):
        return Check("bound-to", Status.FAIL, f"{bound.describe()}, but --dsn reaches {here.describe()}",
                     f"{bound.mend(here)} (or use another --outbox-dir)", data)
    return Check("bound-to", Status.OK, f"{bound.describe()}, the database checked above", None, data)


def check_quarantine(facts: OutboxFacts) -> Check:
    assert facts.status is not None
    names = facts.status.quarantined
    if not names:
        return Check("quarantine", Status.OK, "no quarantined segments", None, {"quarantined": []})
    listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return Check("quarantine", Status.FAIL, f"{len(names)} corrupt segment(s) set aside, their outcomes not "
                 f"applied: {listed}", f"inspect with `shardworker outbox verify --outbox-dir "
                 f"{shlex.quote(facts.directory)}` (their jobs were requeued: {layout.LOST_LOG}), then move them "
                 "out of quarantine/", {"quarantined": names})


def check_kept(facts: OutboxFacts) -> Check:
    """Outcomes kept rather than applied: a stale or cancelled attempt's (by design), or one whose
    job is missing here or that the database refused (worth a look: the file says why)."""
    stale, set_aside = layout.count_stale(facts.directory), layout.count_setaside(facts.directory)
    refused = layout.count_deadlettered(facts.directory)
    data = {"stale": stale, "set_aside": set_aside, "deadlettered": refused}
    if set_aside or refused:
        return Check("kept", Status.WARN, f"{set_aside} outcome(s) set aside (their jobs missing from this database) "
                     f"and {refused} dead-lettered (refused by the database), besides {stale} stale",
                     f"read {layout.SETASIDE_LOG} and {layout.DEADLETTER_DIR}/ in {shlex.quote(facts.directory)}: "
                     "each entry says why; nothing is lost", data)
    return Check("kept", Status.OK, f"{stale} outcome(s) of rescued or cancelled attempts kept, not applied, "
                 f"in {layout.STALE_LOG} (as designed)" if stale else "no outcome kept aside", None, data)


def check_reapply(facts: OutboxFacts, marks: dict[str, int] | None) -> Check:
    """The applied tail kept for a database that comes back older, and whether the database
    holds what this outbox applied (``marks``: each outbox's batch count there; None: unread)."""
    assert facts.status is not None
    st = facts.status
    age = st.kept_oldest_age_s
    kept = (f"{st.kept_bytes / MiB:.1f} MiB of applied outcomes kept over the last {_minutes(age)}"
            if st.kept_segments and age is not None else "no applied outcomes kept (yet, or --reapply-window 0)")
    held = None if marks is None or not facts.outbox_id else marks.get(facts.outbox_id, 0)
    data = {"kept_bytes": st.kept_bytes, "kept_segments": st.kept_segments, "kept_oldest_age_s": age,
            "applied_batch": facts.applied_batch, "database_batch": held}
    if held is not None and held < facts.applied_batch:
        text = (f"the database holds batch {held} of what this outbox applied, which saw batch "
                f"{facts.applied_batch} committed: it went back in time (a failover to a replica that lagged, "
                f"or a restore); {kept}")
        if facts.worker_running:
            return Check("reapply", Status.WARN, text + "; the running worker re-applies them",
                         "check the worker's log for 're-applied what the database lost'", data)
        quoted = shlex.quote(facts.directory)
        return Check("reapply", Status.FAIL, text, f"run `shardworker outbox reapply --outbox-dir {quoted} --dry-run`,"
                     f" then without --dry-run, with the --dsn it belongs to (or start the worker)", data)
    return Check("reapply", Status.OK, kept + ("" if held is None else "; the database holds all this outbox "
                                              "applied"), None, data)


def _minutes(seconds: float | None) -> str:
    return "0 s" if not seconds else f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def outbox_checks(facts: OutboxFacts, *, given: bool, min_free_bytes: int, here: Binding | None,
                  reachable: bool, marks: dict[str, int] | None = None) -> list[Check]:
    checks = [check_outbox_dir(facts, given)]
    if not facts.exists:
        return checks
    if facts.status is None:  # a symlink or another user's: nothing in it is read, or trusted
        return [*checks, check_permissions(facts)]
    return [*checks, check_permissions(facts), check_free_space(facts, min_free_bytes), check_pending(facts),
            check_binding(facts, here, reachable), check_quarantine(facts), check_kept(facts),
            # Another database's marks say nothing of this outbox (bound-to says what is wrong).
            check_reapply(facts, None if here is not None and facts.bound is not None and not facts.bound.same_database(here)
                          else marks)]
