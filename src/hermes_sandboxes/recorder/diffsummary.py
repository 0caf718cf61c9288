"""Summaries of a diff (a list of FileChange) for people: by directory when the change is big.

Pure functions returning data; the CLI and the agent tools render it.

The directory rows are chosen greedily rather than at one fixed depth: starting from ``/``, the
row holding the most changed files is split into its subdirectories as long as the listing stays
within ``max_rows``. So 19,000 files under ``node_modules`` get broken down while a lone change in
``/etc`` stays one row, which a uniform depth cannot do. Rows are disjoint: a row marked ``rest``
counts only the files under its directory that no deeper row lists.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from hermes_sandboxes.sandbox import ChangeKind, FileChange

DEFAULT_MAX_ROWS = 20


@dataclass(frozen=True)
class DirStats:
    """Counts and sizes of the changes under one directory (or in total)."""

    path: str
    added: int = 0
    modified: int = 0
    deleted: int = 0
    added_bytes: int = 0  # size of the added files
    modified_bytes: int = 0  # size now of the modified files
    deleted_bytes: int = 0  # size before of the deleted files
    net_bytes: int = 0  # how much the tree grew (negative when it shrank)
    rest: bool = False  # True when deeper rows list part of this directory's changes

    @property
    def files(self) -> int:
        return self.added + self.modified + self.deleted

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path, "files": self.files, "added": self.added, "modified": self.modified,
            "deleted": self.deleted, "added_bytes": self.added_bytes,
            "modified_bytes": self.modified_bytes, "deleted_bytes": self.deleted_bytes,
            "net_bytes": self.net_bytes, "rest": self.rest,
        }


@dataclass(frozen=True)
class DiffSummary:
    rows: tuple[DirStats, ...]  # sorted by path, at most max_rows
    total: DirStats

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [r.to_dict() for r in self.rows], "total": self.total.to_dict()}


def _parts(path: str) -> tuple[str, ...]:
    return tuple(p for p in path.split("/") if p and p != ".")


def _join(parts: Sequence[str]) -> str:
    return "/" + "/".join(parts)


def stats(path: str, changes: Iterable[FileChange], *, rest: bool = False) -> DirStats:
    """Add up ``changes`` into one row labelled ``path``."""
    counts = {kind: 0 for kind in ChangeKind}
    added_bytes = modified_bytes = deleted_bytes = net = 0
    for change in changes:
        counts[change.kind] += 1
        size, old = change.size or 0, change.old_size or 0
        if change.kind is ChangeKind.ADDED:
            added_bytes += size
            net += size
        elif change.kind is ChangeKind.MODIFIED:
            modified_bytes += size
            net += size - old
        else:
            deleted_bytes += old
            net -= old
    return DirStats(path, counts[ChangeKind.ADDED], counts[ChangeKind.MODIFIED], counts[ChangeKind.DELETED],
                    added_bytes, modified_bytes, deleted_bytes, net, rest)


@dataclass
class _Group:
    depth: int  # number of path components in the group's directory
    changes: list[tuple[tuple[str, ...], FileChange]]
    expandable: bool = True
    rest: bool = False

    @cached_property  # read only while the group's changes are final
    def weight(self) -> tuple[int, int]:
        return len(self.changes), sum(c.size or c.old_size or 0 for _, c in self.changes)


def _children(group: _Group) -> tuple[dict[str, _Group], list[tuple[tuple[str, ...], FileChange]]]:
    """Split a group by its next directory level; files directly in its directory stay behind."""
    children: dict[str, _Group] = {}
    direct = []
    for item in group.changes:
        parts = item[0]
        if len(parts) > group.depth + 1:  # the last component is the file itself
            name = parts[group.depth]
            children.setdefault(name, _Group(group.depth + 1, [])).changes.append(item)
        else:
            direct.append(item)
    return children, direct


def summarize(changes: Iterable[FileChange], *, max_rows: int = DEFAULT_MAX_ROWS) -> DiffSummary:
    """Changes by directory, refined where most of them are, in at most ``max_rows`` rows."""
    max_rows = max(1, max_rows)
    items = [(_parts(c.path), c) for c in changes]
    groups: dict[tuple[str, ...], _Group] = {(): _Group(0, items, expandable=bool(items))}
    while True:
        candidates = [(g.weight, key) for key, g in groups.items() if g.expandable]
        if not candidates:
            break
        key = min(candidates, key=lambda c: (-c[0][0], -c[0][1], c[1]))[1]
        group = groups[key]
        children, direct = _children(group)
        if not children:
            group.expandable = False
            continue
        room = max_rows - len(groups) + 1 - (1 if direct else 0)  # rows left for children if split
        ranked = sorted(children.items(), key=lambda kv: (-kv[1].weight[0], -kv[1].weight[1], kv[0]))
        if len(ranked) > room:
            # Too many subdirectories: list the ones that stand out, keep the others in this row as
            # the rest. Below the root, 17 of 300 equal packages would only be noise.
            floor = 0 if not key else group.weight[0] / max_rows
            ranked = [kv for kv in ranked[: max(0, max_rows - len(groups))] if kv[1].weight[0] >= floor]
            moved = {id(item) for _, child in ranked for item in child.changes}
            group.changes = [item for item in group.changes if id(item) not in moved]
            group.expandable, group.rest = False, bool(ranked)
        else:
            del groups[key]
            if direct:
                groups[key] = _Group(group.depth, direct, expandable=False, rest=True)
        for name, child in ranked:
            groups[(*key, name)] = child
    rows = tuple(stats(_join(key), (c for _, c in groups[key].changes), rest=groups[key].rest)
                 for key in sorted(groups))
    return DiffSummary(rows if items else (), stats("/", (c for _, c in items)))


def full_listing(changes: Iterable[FileChange]) -> list[FileChange]:
    """Every change, sorted by path (the ``--full`` view)."""
    return sorted(changes, key=lambda c: _parts(c.path))
