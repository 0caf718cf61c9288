"""Descriptors to a live overlay layer's entries, kept by the store's helper between checkpoints.

A delta checkpoint (increment.py) looks at every entry of the live layer: on ext4 nothing else
tells a file written in place from one left alone. An ``lstat`` by name costs a path lookup each
time; ``fstat`` of a descriptor opened once (``O_PATH``: no read access, no open of a device or a
fifo) costs well under half of it (1,640 entries: 2.5 ms against 5.8 ms in the helper at load 3).
So the helper (``mapped``), which outlives one call, keeps one ``O_PATH`` descriptor per entry of the
layers it checkpointed, and the record of the last checkpoint it took of each (no state file to
read back); for a directory with a descriptor per entry, the descriptors in the record's order
(its row), so that an unchanged directory is told by one ``fstat`` per entry in C loops and one
list comparison.

A descriptor is only ever trusted for the inode it was opened on: the walk takes its ``fstat`` for
an entry only in a directory that is the same as then (no entry added, removed or renamed in it,
so the name still names the inode recorded then) and only when its inode number is the recorded
one (a descriptor holds its inode, whose number cannot be reused while it is open; one is kept
only for an entry on the layer's own filesystem).
Anything else is looked up by name, as without this cache; a new process starts with none.

What it costs: a descriptor keeps its inode, so a file the sandbox deleted keeps its blocks until
the next checkpoint of its layer (which closes the descriptors of names gone), the removal or
restore of the sandbox through this store (``prune``), or the end of the process: at most what
the layer held at its last checkpoint (of which that checkpoint holds a copy anyway). The first
checkpoint of a layer in a process opens none (a command that takes one checkpoint and exits
would pay for nothing); the next one opens them.
Only in the helper: work run directly (root) keeps nothing.
"""

from __future__ import annotations

import contextlib
import os
import resource
from dataclasses import dataclass, field
from typing import Any

from hermes_sandboxes.backends.local.store import mapped

PATH = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
Blobs = dict[str, tuple[dict[str, tuple[int, int]], bytes]]  # directory -> (its entries, their marshal)
Row = tuple[dict[str, tuple[int, int]], list[int], list[tuple[int, int]], list[tuple[int, str]]]
_LAYERS = 8  # layers kept at most (the least recently checkpointed goes first)
_MOST = 1 << 16  # descriptors kept at most, over every layer


@dataclass(eq=False)
class Held:
    """One live layer's descriptors and last record, for the layer of ``token`` whose upper
    directory is ``upper`` (device, inode: a restored layer at the same path is another)."""

    upper: str
    ident: tuple[int, int]
    populate: bool = False  # whether walks open descriptors (from the second checkpoint on)
    dirs: dict[str, dict[str, int]] = field(default_factory=dict)  # directory -> name -> descriptor
    # directory -> (its entries' record then, their descriptors, their idents, its subdirectories'
    # places and paths), in the record's order: a directory whose descriptors all give the idents
    # recorded is unchanged, told in C loops (increment's _Walk.same); dropped on any change of its
    # descriptors
    rows: dict[str, Row] = field(default_factory=dict)
    # (the state file's identity, entries by directory, upper's own ident) of the last checkpoint
    record: tuple[tuple[int, ...], dict[str, dict[str, tuple[int, int]]], tuple[int, int]] | None = None
    blobs: Blobs = field(default_factory=dict)  # that record's directories, each encoded (increment._encode)

    def open(self, dfd: int, name: str) -> int | None:
        """A new descriptor to ``name`` in directory ``dfd``, or None when the budget is spent."""
        global _count
        if _count >= _budget():
            return None
        fd = os.open(name, PATH, dir_fd=dfd)
        _count += 1
        return fd

    def close(self, fd: int) -> None:
        global _count
        with contextlib.suppress(OSError):
            os.close(fd)
        _count -= 1

    def close_all(self, names: dict[str, int]) -> None:
        for fd in names.values():
            self.close(fd)
        names.clear()

    def keep_only(self, directories: dict[str, Any]) -> None:
        """Close the descriptors of every directory that is not in ``directories`` (gone since)."""
        for rel in [rel for rel in self.dirs if rel not in directories]:
            self.rows.pop(rel, None)
            self.close_all(self.dirs.pop(rel))

    def drop(self) -> None:
        for names in self.dirs.values():
            self.close_all(names)
        self.dirs.clear()
        self.rows.clear()
        self.record = None
        self.blobs = {}


_layers: dict[str, Held] = {}  # by layer token, the most recently used last
_count = 0  # descriptors held, over every layer
_limit: int | None = None


def _budget() -> int:
    """Descriptors the cache may hold: the soft limit raised once (towards the hard one, never to
    more than the cache needs), half of it left for the rest of the helper's work."""
    global _limit
    if _limit is None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = 2 * _MOST + 1024
        if hard != resource.RLIM_INFINITY:
            wanted = min(wanted, hard)
        if wanted > soft:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
                soft = wanted
        _limit = min(_MOST, max(0, soft // 2 - 64))
    return _limit


def for_layer(token: str, upper: str, st: os.stat_result) -> Held | None:
    """The cache of the layer of ``token`` whose upper directory is ``upper`` (``st``: its lstat);
    None outside the helper."""
    if not mapped.serving():
        return None
    prune()
    held = _layers.pop(token, None)
    if held is not None and held.ident != (st.st_dev, st.st_ino):
        held.drop()
        held = None
    if held is None:
        held = Held(upper, (st.st_dev, st.st_ino))
    else:
        held.populate = True
    _layers[token] = held
    while len(_layers) > _LAYERS:
        _layers.pop(next(iter(_layers))).drop()
    return held


def prune() -> None:
    """Drop the cache of every layer no longer at its path (removed, or replaced by a restore):
    its descriptors would keep its files' blocks."""
    for token, held in list(_layers.items()):
        try:
            st = os.lstat(held.upper)
            gone = (st.st_dev, st.st_ino) != held.ident
        except OSError:
            gone = True
        if gone:
            _layers.pop(token).drop()


def count() -> int:
    """Descriptors held now, over every layer."""
    return _count


def state_identity(st: os.stat_result) -> tuple[int, ...]:
    """What tells a state file from any other (it is never changed in place; a fold links it,
    which moves its ctime)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns
