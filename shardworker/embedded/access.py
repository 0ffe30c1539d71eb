"""Letting the embedded server's system user reach its paths when this process is root: a
POSIX ACL entry granting that one user search on each directory it could not search (never
``o+x``), written as the ``system.posix_acl_access`` extended attribute; and handing a data
directory over to that user."""

from __future__ import annotations

import os
import pwd
import stat
import struct
from pathlib import Path

from shardworker.embedded.programs import PG_SYSTEM_USER, EmbeddedPostgresError


def ensure_traversable(path: Path, owner: pwd.struct_passwd) -> None:
    """Let ``owner`` (only) search ``path`` and each ancestor it could not otherwise search."""
    for directory in (path, *path.parents):
        st = directory.stat()
        if st.st_uid == owner.pw_uid:
            allowed = st.st_mode & stat.S_IXUSR
        elif st.st_gid == owner.pw_gid:
            allowed = st.st_mode & stat.S_IXGRP
        else:
            allowed = st.st_mode & stat.S_IXOTH
        if not allowed and not _acl_allows_search(directory, owner.pw_uid):
            _grant_search(directory, owner.pw_uid)


# POSIX ACLs in their extended-attribute form (linux/posix_acl_xattr.h): a version word, then
# (tag, perm, id) entries sorted by tag and id.
_ACL_XATTR = "system.posix_acl_access"
_ACL_VERSION = 2
_ACL_HEADER, _ACL_ENTRY = struct.Struct("<I"), struct.Struct("<HHI")
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_NO_ID = 0xFFFFFFFF
_SEARCH = 1


def _acl_entries(path: Path) -> list[tuple[int, int, int]]:
    """The directory's ACL, or the one its mode bits stand for."""
    try:
        blob = os.getxattr(path, _ACL_XATTR)
    except OSError:
        mode = stat.S_IMODE(path.stat().st_mode)
        return [(_USER_OBJ, mode >> 6 & 7, _NO_ID), (_GROUP_OBJ, mode >> 3 & 7, _NO_ID), (_OTHER, mode & 7, _NO_ID)]
    return [_ACL_ENTRY.unpack_from(blob, offset) for offset in range(_ACL_HEADER.size, len(blob), _ACL_ENTRY.size)]


def _acl_allows_search(path: Path, uid: int) -> bool:
    """Whether ``uid`` has an entry granting search, not masked off (a ``chmod`` resets the mask)."""
    entries = _acl_entries(path)
    mask = next((perm for tag, perm, _ in entries if tag == _MASK), 7)
    return any(tag == _USER and ident == uid and perm & mask & _SEARCH for tag, perm, ident in entries)


def _grant_search(path: Path, uid: int) -> None:
    """Add a ``user:<uid>:--x`` entry to ``path``'s ACL (as ``setfacl -m u:<uid>:x`` would)."""
    entries = [e for e in _acl_entries(path) if not (e[0] == _USER and e[2] == uid) and e[0] != _MASK]
    entries.append((_USER, _SEARCH, uid))
    group_class = 0
    for tag, perm, _ in entries:
        if tag in (_USER, _GROUP_OBJ, _GROUP):
            group_class |= perm
    entries.append((_MASK, group_class, _NO_ID))
    entries.sort(key=lambda e: (e[0], e[2]))
    blob = _ACL_HEADER.pack(_ACL_VERSION) + b"".join(_ACL_ENTRY.pack(*e) for e in entries)
    try:
        os.setxattr(path, _ACL_XATTR, blob)
    except OSError as exc:
        raise EmbeddedPostgresError(
            f"the embedded server runs as {PG_SYSTEM_USER}, which cannot reach {path}, and the file system "
            f"does not take an ACL letting it ({exc.strerror}); use --dsn with your own server, or run from a "
            "directory that user can reach") from exc


def chown_tree(root: Path, owner: pwd.struct_passwd) -> None:
    os.chown(root, owner.pw_uid, owner.pw_gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), owner.pw_uid, owner.pw_gid, follow_symlinks=False)
