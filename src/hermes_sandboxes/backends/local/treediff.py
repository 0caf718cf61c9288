"""Diff two overlay upper layers (a checkpoint against another, or against the live layer).

Only the writable layers are walked: everything else is the shared read-only base, unchanged by
definition, so the cost follows what the sandbox changed, not the size of its root filesystem.
Overlay encodes deletions in the upper layer as whiteouts (character devices 0/0), which this
reads as "deleted". A file counts as modified when its type, size, mode, owner, mtime, symlink
target or xattrs differ; directories only when their mode or owner changed (their mtime moves with
every change inside them, which the entries themselves already report).
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from hermes_sandboxes.sandbox import ChangeKind, FileChange

OPAQUE_XATTR = "trusted.overlay.opaque"


class _Entry(NamedTuple):
    mode: int
    uid: int
    gid: int
    size: int
    mtime_ns: int
    rdev: int

    @property
    def is_whiteout(self) -> bool:
        return stat.S_ISCHR(self.mode) and self.rdev == 0

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


def _scan(root: Path, opaque: set[str]) -> dict[str, _Entry]:
    entries: dict[str, _Entry] = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            listing = list(os.scandir(os.path.join(root, rel) if rel else root))
        except FileNotFoundError:
            continue
        for item in listing:
            path = f"{rel}/{item.name}" if rel else item.name
            st = item.stat(follow_symlinks=False)
            entries[path] = _Entry(st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, st.st_rdev)
            if stat.S_ISDIR(st.st_mode):
                stack.append(path)
                try:
                    if os.getxattr(item.path, OPAQUE_XATTR) == b"y":
                        opaque.add(path)
                except OSError:
                    pass
    return entries


def _base_entry(lower: Path | None, rel: str, opaque: set[str]) -> os.stat_result | None:
    """What the base shows at ``rel`` (so a new upper copy of it is a modification), if anything."""
    if lower is None:
        return None
    parts = rel.split("/")
    if any("/".join(parts[:i]) in opaque for i in range(1, len(parts))):
        return None
    try:
        return os.lstat(lower / rel)
    except OSError:
        return None


def _content_differs(old_root: Path, new_root: Path, rel: str, old: _Entry, new: _Entry) -> bool:
    if (stat.S_IFMT(old.mode), old.uid, old.gid, stat.S_IMODE(old.mode)) != (
        stat.S_IFMT(new.mode), new.uid, new.gid, stat.S_IMODE(new.mode)
    ):
        return True
    if new.is_dir:
        return False
    if (old.size, old.mtime_ns) != (new.size, new.mtime_ns):
        return True
    if stat.S_ISLNK(new.mode):
        return os.readlink(old_root / rel) != os.readlink(new_root / rel)
    return False


def diff_layers(old_root: Path, new_root: Path, lower: Path | None = None) -> list[FileChange]:
    """Changes from the layer ``old_root`` to ``new_root`` over the base ``lower``."""
    opaque: set[str] = set()
    old, new = _scan(old_root, opaque), _scan(new_root, opaque)
    changes: list[FileChange] = []
    for rel in sorted(old.keys() | new.keys()):
        change = _classify("/" + rel, old_root, new_root, rel, old.get(rel), new.get(rel),
                           functools.partial(_base_entry, lower, rel, opaque))
        if change is not None:
            changes.append(change)
    return changes


def _classify(path: str, old_root: Path, new_root: Path, rel: str, before: _Entry | None,
              after: _Entry | None, in_base: Callable[[], os.stat_result | None]) -> FileChange | None:
    def size(entry: _Entry) -> int | None:
        return None if entry.is_dir or entry.is_whiteout else entry.size


    gone_before = before is None or before.is_whiteout
    gone_after = after is None or after.is_whiteout
    if before is None and after is not None:  # first change since the checkpoint to a base path?
        base = in_base()
        base_size = None if base is None or stat.S_ISDIR(base.st_mode) else base.st_size
        if after.is_whiteout:
            return FileChange(path, ChangeKind.DELETED, None, base_size)
        if base is None:
            return FileChange(path, ChangeKind.ADDED, size(after))
        if after.is_dir:
            return None  # copied up only to hold a change below it, which is reported itself
        return FileChange(path, ChangeKind.MODIFIED, size(after), base_size)
    if gone_before and gone_after:
        if before is not None and after is None:  # a whiteout went away: the base file is back
            base = in_base()
            return FileChange(path, ChangeKind.ADDED,
                              None if base is None or stat.S_ISDIR(base.st_mode) else base.st_size)
        return None
    if gone_before:
        assert after is not None
        return FileChange(path, ChangeKind.ADDED, size(after))
    assert before is not None
    if gone_after:
        base = in_base() if after is None else None  # dropped from the layer: the base shows again
        if base is None:
            return FileChange(path, ChangeKind.DELETED, None, size(before))
        if before.is_dir and stat.S_ISDIR(base.st_mode):
            return None  # a copied-up directory went away; what changed below is reported itself
        return FileChange(path, ChangeKind.MODIFIED, None if stat.S_ISDIR(base.st_mode) else base.st_size,
                          size(before))
    assert after is not None
    if _content_differs(old_root, new_root, rel, before, after):
        return FileChange(path, ChangeKind.MODIFIED, size(after), size(before))
    return None
