"""Diff two overlay upper layers (a checkpoint against another, or against the live layer).

Only the writable layers are walked: everything else is the shared read-only base, unchanged by
definition. Overlay encodes deletions in the upper layer as whiteouts (character devices 0/0),
which this reads as "deleted". A file counts as modified when its type, size, mode, owner, mtime
or symlink target differ; directories only when their mode or owner changed (their mtime moves
with every change inside them, which the entries themselves already report).

Two ways to find what to compare, with the same result: the whole of both layers, or only what a
caller knows may differ (a ``Hint``: e.g. from btrfs generations, see btrfstree), in which case
the cost follows the change instead of the layer. A directory found in only one layer, or as two
different directories, is then compared whole. Every read goes through
``fdwalk``, so a layer that changes meanwhile can never lead the walk outside it.
"""

from __future__ import annotations

import functools
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from hermes_sandboxes.backends.local.store.fdwalk import Tree, join
from hermes_sandboxes.sandbox import ChangeKind, FileChange
from hermes_sandboxes.util import failpoints

OPAQUE_XATTR = "trusted.overlay.opaque"


class Hint(NamedTuple):
    """Where two layers that share their unchanged inodes (a snapshot and its descendants) differ."""

    dirs: set[str]  # directories whose entries may differ (relative paths)
    inodes: set[int]  # inodes that may differ in either layer; any other is the same in both


class TooBig(Exception):
    """The walk passed its budget; says how far it got."""


WALKING = 2048  # entries walked when a diff passes the failpoint "diff-walking"


class Budget(NamedTuple):
    """How much one diff may walk: entries kept in memory (both layers together) and seconds.
    The defaults keep a diff of a hostile layer (millions of files) at a few hundred MB and
    half a minute; a diff that passes them raises TooBig instead of taking the host with it."""

    entries: int = 400_000
    seconds: float = 30.0

    def start(self) -> Spend:
        return Spend(self)


class Spend:
    """One diff's use of its budget, from its start: the hint that may precede the walk (a store's
    change_hint) spends the same seconds, and its changed inodes are held to the same count."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.count = self.ticks = 0
        self.deadline = time.monotonic() + budget.seconds

    def tick(self) -> None:
        self.ticks += 1
        if self.ticks % 1024 == 0 and time.monotonic() > self.deadline:
            raise TooBig(f"the diff stopped after {self.budget.seconds:g} s (its time limit), having walked "
                         f"{self.count:,} entries: what changed is more than a diff can work out in time")

    def hinted(self, inodes: int) -> None:
        """A hint holds ``inodes`` changed inodes so far (each kept in memory, as an entry is)."""
        self.tick()
        if inodes > self.budget.entries:
            raise TooBig(f"the diff stopped after {inodes:,} changed inodes (its limit): the layers hold more "
                         "than a diff can count; what is past that is unknown")

    def one(self) -> None:
        self.count += 1
        if self.count == WALKING:
            failpoints.pause("diff-walking")  # a test's stop in the middle of a walk
        if self.count > self.budget.entries or (self.count % 1024 == 0 and time.monotonic() > self.deadline):
            raise TooBig(f"the diff stopped after {self.count:,} entries"
                         + (" (its limit)" if self.count > self.budget.entries else
                            f" and {self.budget.seconds:g} s (its time limit)")
                         + ": the layers hold more than a diff can count; what is past that is unknown")


class _Entry(NamedTuple):
    mode: int
    uid: int
    gid: int
    size: int
    mtime_ns: int
    rdev: int
    ino: int

    @property
    def is_whiteout(self) -> bool:
        return stat.S_ISCHR(self.mode) and self.rdev == 0

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


def _entry(st: os.stat_result) -> _Entry:
    return _Entry(st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, st.st_rdev, st.st_ino)


class _Side:
    """One layer's entries at the paths compared so far."""

    def __init__(self, tree: Tree | None, opaque_xattr: str, spend: Spend) -> None:
        self.tree = tree
        self.entries: dict[str, _Entry] = {}
        self._opaque: dict[str, bool] = {}
        self._opaque_xattr = opaque_xattr
        self._spend = spend
        self.whole: set[str] = set()  # subtrees read whole (add_subtree)

    def names(self, rel: str) -> dict[str, int]:
        return (self.tree.names(rel) if self.tree else None) or {}

    def stat(self, rel: str, name: str) -> _Entry | None:
        st = self.tree.lstat(rel, name) if self.tree else None
        self._spend.one()
        return None if st is None else _entry(st)

    def add_subtree(self, rel: str) -> None:
        self.whole.add(rel)
        if self.tree is not None:
            for path, st in self.tree.walk(rel):
                self._spend.one()
                self.entries[path] = _entry(st)

    def opaque(self, rel: str) -> bool:
        if rel not in self._opaque:
            value = self.tree.dir_xattr(rel, self._opaque_xattr) if self.tree else None
            self._opaque[rel] = value == b"y"
        return self._opaque[rel]


def diff_layers(old_root: Path, new_root: Path, lower: Path | None = None,
                hint: Hint | None = None, opaque_xattr: str = OPAQUE_XATTR,
                budget: Budget | None = None, spend: Spend | None = None) -> list[FileChange]:
    """Changes from the layer ``old_root`` to ``new_root`` over the base ``lower``; a ``hint``
    limits the comparison to where the layers may differ; ``opaque_xattr``: the overlay's marker of
    an opaque directory (``user.overlay.opaque`` in layers of a user-namespace overlay). The walk
    stops with TooBig when it passes ``budget`` (default ``Budget()``), or what is left of
    ``spend`` (the budget the hint started spending)."""
    old_tree, new_tree = _open(old_root), _open(new_root)
    spend = spend or (budget or Budget()).start()
    try:
        old, new = _Side(old_tree, opaque_xattr, spend), _Side(new_tree, opaque_xattr, spend)
        if hint is None:
            old.add_subtree("")
            new.add_subtree("")
        else:
            walked = _Walked(old, new)
            for directory in sorted(hint.dirs):
                if not walked.covers(directory):  # a subtree read whole already holds it
                    _compare_directory(old, new, directory, hint.inodes)
        base = _Base(lower, old, new)
        changes: list[FileChange] = []
        for rel in sorted(old.entries.keys() | new.entries.keys()):
            spend.tick()  # the time budget covers this second pass too
            change = _classify("/" + rel, old, new, rel, old.entries.get(rel), new.entries.get(rel),
                               functools.partial(base.entry, rel))
            if change is not None:
                changes.append(change)
        return changes
    finally:
        for tree in (old_tree, new_tree):
            if tree is not None:
                tree.close()


class _Walked:
    """Whether a directory lies in a subtree read whole (so the hint's directories below it need no
    comparing: every entry there is recorded already). Answered per directory
    from its parent's answer, kept: a hint listing every level of a deep new tree costs one look-up
    per directory, not a walk of everything below each one."""

    def __init__(self, old: _Side, new: _Side) -> None:
        self.old, self.new = old, new
        self._known: dict[str, bool] = {"": False}

    def covers(self, directory: str) -> bool:
        pending = []
        while directory not in self._known:
            pending.append(directory)
            directory = directory.rpartition("/")[0]
        covered = self._known[directory]
        for rel in reversed(pending):
            # read whole on one side means: the same on both, or no directory there on the other
            covered = covered or rel in self.old.whole or rel in self.new.whole
            self._known[rel] = covered
        return covered


def _open(root: Path) -> Tree | None:
    try:
        return Tree(root)
    except FileNotFoundError:
        return None


def _compare_directory(old: _Side, new: _Side, directory: str, changed: set[int]) -> None:
    """Record both layers' entries of ``directory`` (but those that are one unchanged inode in
    both), and whole subtrees where a subdirectory is not the same directory in both."""
    before, after = old.names(directory), new.names(directory)
    for name in before.keys() | after.keys():
        ino_before, ino_after = before.get(name), after.get(name)
        if ino_before is not None and ino_before == ino_after and ino_before not in changed:
            continue
        rel = join(directory, name)
        b = old.stat(directory, name) if ino_before is not None else None
        a = new.stat(directory, name) if ino_after is not None else None
        if b is not None:
            old.entries[rel] = b
        if a is not None:
            new.entries[rel] = a
        b_dir, a_dir = b is not None and b.is_dir, a is not None and a.is_dir
        same_dir = b_dir and a_dir and b is not None and a is not None and b.ino == a.ino
        if b_dir and not same_dir:
            old.add_subtree(rel)
        if a_dir and not same_dir:
            new.add_subtree(rel)


class _Base:
    """What the base shows at a path (so a new upper copy of it is a modification), if anything.

    Whether a directory hides the base below it (opaque in either layer, or absent from the base)
    is worked out once per directory and kept, from its parent's answer: the cost is one check per
    directory, not one per ancestor of every entry (which made a tree N deep cost N^2 directory
    lookups per entry, and a 4,000-deep one more than five minutes)."""

    def __init__(self, lower: Path | None, old: _Side, new: _Side) -> None:
        self.lower, self.old, self.new = lower, old, new
        self._visible: dict[str, bool] = {"": lower is not None}  # does the base show through here?

    def _shows_through(self, directory: str) -> bool:
        pending = []
        while directory not in self._visible:
            pending.append(directory)
            directory = directory.rpartition("/")[0]
        visible = self._visible[directory]
        for rel in reversed(pending):  # from the known ancestor down
            visible = visible and not (self.old.opaque(rel) or self.new.opaque(rel)) and self._is_dir(rel)
            self._visible[rel] = visible
        return visible

    def _is_dir(self, rel: str) -> bool:
        try:
            return stat.S_ISDIR(os.lstat(self.lower / rel).st_mode) if self.lower is not None else False
        except OSError:  # absent, or deeper than any path the base can hold
            return False

    def entry(self, rel: str) -> os.stat_result | None:
        if self.lower is None or not self._shows_through(rel.rpartition("/")[0]):
            return None
        try:
            return os.lstat(self.lower / rel)
        except OSError:
            return None


def _content_differs(old: _Side, new: _Side, rel: str, before: _Entry, after: _Entry) -> bool:
    if (stat.S_IFMT(before.mode), before.uid, before.gid, stat.S_IMODE(before.mode)) != (
        stat.S_IFMT(after.mode), after.uid, after.gid, stat.S_IMODE(after.mode)
    ):
        return True
    if after.is_dir:
        return False
    if (before.size, before.mtime_ns) != (after.size, after.mtime_ns):
        return True
    if stat.S_ISLNK(after.mode):
        assert old.tree is not None and new.tree is not None  # both have an entry here
        return old.tree.readlink(rel) != new.tree.readlink(rel)
    return False


def _classify(path: str, old: _Side, new: _Side, rel: str, before: _Entry | None,
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
    if _content_differs(old, new, rel, before, after):
        return FileChange(path, ChangeKind.MODIFIED, size(after), size(before))
    return None
