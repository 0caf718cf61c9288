"""Chained delta checkpoints of an overlay layer: each holds only what changed since the one before.

Without snapshots or reflinks (ext4), a checkpoint is a copy of the sandbox's writable layer (the
files it changed since it was created). Copying, or even hard-linking, that whole layer at every
checkpoint makes a checkpoint after a small change cost all the earlier changes again. Here:

- the first checkpoint of a layer holds the layer in full (``upper``), as every checkpoint of
  the other kinds and of earlier versions of this store does (a checkpoint without ``delta.json``
  is read as full);
- a later one holds only the entries of the live layer that changed since its parent (the
  previous checkpoint of the same layer) and ``delta.json``: the parent's id and the paths deleted
  since. Unchanged directories above a changed entry are there too, with their attributes;
- a restore, a fork and a diff read the chain (full first, then each delta: its deletions, then
  its entries, replacing whatever was at their paths, directories merged) into a fresh layer (a
  copy) or a view (hard links to the checkpoints' own files: they never change after they are
  made);
- deleting a checkpoint folds it into each child (a hard-link copy of the two, swapped in for the
  child in one exchange) before its record goes: every remaining checkpoint reads the same.

What changed is told by ``state``, written with each checkpoint: every entry of the live layer
then, by path, with its inode and ctime (version 3: each directory's entries a marshal blob of their
own, so the helper re-encodes only the directories that changed; version 2's, one marshal of it
all, is still read). The kernel moves an inode's ctime on every change of its
data, metadata or names (write, truncate, chmod, chown, xattr, link, unlink, rename) and no caller
can set it; overlay's copy-up makes a new inode. One exception: a write through a shared mapping
moves it only when it faults, and a page already dirty and writable takes writes without a fault;
so every file a checkpoint copies gets its writeback started (copier's ``live``), which makes its
pages clean and write-protected: whatever is written after the checkpoint faults and moves the
ctime (a file the checkpoint did not copy had no such write since the one before, which did). So
an entry at the same path with the same inode and ctime is unchanged; before Linux 6.13 (coarse
timestamps: a change right after a checkpoint might keep the ctime) a ctime within ``_RECENT_NS``
of the checkpoint is recorded as unknown. One look per entry of the live layer (an ``fstat`` of
the store helper's descriptor to it, handles.py, else an ``lstat``; no copy, link or write per
unchanged entry), then a copy per changed one. A state only
speaks for the layer it was taken of (``token``, a random id the layer gets at its first
checkpoint: a restored or forked layer is a new copy with none, so its first checkpoint is full).

Runs as root of the sandbox's user namespace (``mapped``): the layer holds inner users' files.
"""

from __future__ import annotations

import contextlib
import errno
import json
import marshal
import operator
import os
import stat
import time
from pathlib import Path
from typing import Any

from hermes_sandboxes.backends.local.store import copier, handles
from hermes_sandboxes.backends.local.store.base import remove_tree
from hermes_sandboxes.errors import SandboxError

STATE = "state"  # in a checkpoint: the live layer's entries when it was taken
DELTA = "delta.json"  # in a delta checkpoint: {"parent": id, "deleted": [paths]}
TOKEN = "token"  # in a live layer: its identity
PARENT = "parent"  # in a live layer: the id of the checkpoint last taken of it

def _recent_ns() -> int:
    """How close to a checkpoint a ctime is too close to tell a later change by: none from Linux
    6.13 (multigrain timestamps: a change after a ctime was read gets a later one), else a few ticks."""
    try:
        major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    except ValueError:
        return 20_000_000
    return 0 if (major, minor) >= (6, 13) else 20_000_000


_RECENT_NS = _recent_ns()
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
Ident = tuple[int, int]  # inode, ctime_ns (-1: too recent to tell a later change by)
Record = dict[str, dict[str, Ident]]  # each directory under upper ("" is upper) -> its entries' names -> Ident
Touched = dict[str, tuple[str | None, os.stat_result]]  # directory made or changed -> its source, its lstat


def _refusal(exc: OSError) -> SandboxError:
    why = exc.strerror or str(exc)
    if exc.errno == errno.ENAMETOOLONG:  # cp -a fails there as well: it copies by path too
        why += " (the layer nests directories deeper than a path can name; only the btrfs stores take that)"
    return SandboxError(f"copying the layer failed: {why}")


def copy_layer(source: Path, target: Path) -> None:
    """``cp -a source target``, in-process (copier.py); SandboxError if it cannot be copied."""
    try:
        copier.copy_tree(source, target)
    except OSError as exc:
        raise _refusal(exc) from None


def copy_live(layer: Path, target: Path) -> None:
    """A new layer at ``target`` with a copy of ``layer``'s files (its identity is not copied)."""
    try:
        os.mkdir(target, 0o700)
        copier.copy_tree(layer / "upper", target / "upper")
        os.mkdir(target / "work", 0o700)
    except OSError as exc:
        raise _refusal(exc) from None


# records -------------------------------------------------------------------------------------
def layer_token(layer: Path, create: bool) -> str | None:
    try:
        fd = os.open(layer / TOKEN, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        if not create:
            return None
    else:
        try:
            return os.read(fd, 256).decode().strip() or None
        finally:
            os.close(fd)
    token = os.urandom(16).hex()
    staged = layer / f".{TOKEN}-{os.getpid()}"
    staged.write_text(token)
    staged.rename(layer / TOKEN)
    return token


def read_state(checkpoint: Path) -> tuple[str, int, Ident, Record] | None:
    """(token, taken, upper's own ident, entries by directory) of a checkpoint's state, or None (a
    full checkpoint of an earlier version, or a state this Python cannot read: then it is simply
    not a parent)."""
    try:
        data = marshal.loads((checkpoint / STATE).read_bytes())
    except (OSError, EOFError, ValueError, TypeError):
        return None
    if not isinstance(data, dict) or data.get("v") not in (2, 3):
        return None
    dirs = data["dirs"]
    if data["v"] == 3:  # each directory's entries a marshal blob of their own (_encode)
        try:
            dirs = {rel: marshal.loads(blob) for rel, blob in dirs.items()}
        except (EOFError, ValueError, TypeError):
            return None
    return data["token"], data["taken"], data["root"], dirs


def _encode(token: str, taken: int, root: Ident, dirs: Record, blobs: handles.Blobs) -> tuple[bytes, handles.Blobs]:
    """A state (version 3: version 2's, each directory's entries marshalled on their own) and the
    blobs it is made of. A directory a walk found unchanged is the very dict of the record before
    (records are never changed in place), so its blob from ``blobs`` (the helper's, of the last
    checkpoint) is reused: a checkpoint encodes only the directories that changed."""
    made: handles.Blobs = {}
    for rel, entries in dirs.items():
        kept = blobs.get(rel)
        made[rel] = kept if kept is not None and kept[0] is entries else (entries, marshal.dumps(entries))
    state = {"v": 3, "token": token, "taken": taken, "root": root,
             "dirs": {rel: blob for rel, (_, blob) in made.items()}}
    return marshal.dumps(state), made


def read_delta(checkpoint: Path) -> tuple[str, list[str]] | None:
    """(parent id, deleted paths) of a delta checkpoint; None for a full one."""
    try:
        data = json.loads((checkpoint / DELTA).read_text())
    except FileNotFoundError:
        return None
    return str(data["parent"]), [str(p) for p in data["deleted"]]


def _write_delta(checkpoint: Path, parent: str, deleted: list[str]) -> None:
    _write_new(checkpoint / DELTA, json.dumps({"parent": parent, "deleted": deleted}).encode())


def _ident(st: os.stat_result, taken: int) -> Ident:
    ctime = st.st_ctime_ns
    return st.st_ino, (-1 if _RECENT_NS and ctime >= taken - _RECENT_NS else ctime)


def _recorded(directory: Path, checkpoint_id: str) -> bool:
    return (directory / checkpoint_id).is_dir() and (directory / f"{checkpoint_id}.json").exists()


def _parent(layer: Path, directory: Path, token: str, held: handles.Held | None) -> tuple[str, Record, Ident] | None:
    """The checkpoint last taken of this very layer (the layer's pointer, else the newest state
    with its token), with its state (the helper's copy when it is that very file's); None if it
    has none."""
    with contextlib.suppress(OSError):
        pointed = os.readlink(layer / PARENT)
        if _recorded(directory, pointed):
            if held is not None and held.record is not None:
                identity, record, root = held.record
                if handles.state_identity(os.stat(directory / pointed / STATE)) == identity:
                    return pointed, record, root
            state = read_state(directory / pointed)
            if state is not None and state[0] == token:
                return pointed, state[3], state[2]
    best: tuple[int, str, Record, Ident] | None = None
    for entry in os.scandir(directory):
        if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
            continue
        if not (directory / f"{entry.name}.json").exists():
            continue
        state = read_state(Path(entry.path))
        if state is not None and state[0] == token and (best is None or state[1] > best[0]):
            best = (state[1], entry.name, state[3], state[2])
    return None if best is None else (best[1], best[2], best[3])


def point_to(layer: Path, checkpoint_id: str) -> None:
    """Make ``checkpoint_id`` the layer's next parent (a symlink: replacing a file by rename
    makes ext4 write it out first, which costs more than the rest of a small checkpoint)."""
    staged = layer / f".{PARENT}-{os.getpid()}"
    try:
        os.symlink(checkpoint_id, staged)
    except FileExistsError:  # left by a process of this pid that was killed here
        staged.unlink()
        os.symlink(checkpoint_id, staged)
    staged.rename(layer / PARENT)


def pointed(layer: Path) -> str | None:
    try:
        return os.readlink(layer / PARENT)
    except OSError:
        return None


# a checkpoint --------------------------------------------------------------------------------
def checkpoint(layer: Path, staged: Path, directory: Path) -> str | None:
    """Make ``staged`` (in the checkpoints ``directory``) a checkpoint of ``layer``: a delta on the
    previous checkpoint of this layer if there is one (its id is returned), else the layer in full."""
    try:
        token = layer_token(layer, create=True)
        assert token is not None
        upper = layer / "upper"
        taken = time.time_ns()
        upper_st = os.lstat(upper)
        held = handles.for_layer(token, os.fspath(upper), upper_st)
        parent = _parent(layer, directory, token, held)
        os.mkdir(staged, 0o700)
        os.mkdir(staged / "work", 0o700)
        root = _ident(upper_st, taken)
        if parent is None:
            seen: dict[str, os.stat_result] = {}
            copier.copy_tree(upper, staged / "upper", seen, live=True)
            dirs: Record = {"": {}}
            for rel, st in seen.items():
                above, _, name = rel.rpartition("/")
                dirs.setdefault(above, {})[name] = _ident(st, taken)
                if stat.S_ISDIR(st.st_mode):
                    dirs.setdefault(rel, {})
        else:
            dirs, deleted = _delta(os.fspath(upper), os.fspath(staged / "upper"), parent[1], parent[2], taken,
                                   upper_st, held)
            _write_delta(staged, parent[0], deleted)
        data, blobs = _encode(token, taken, root, dirs, held.blobs if held is not None else {})
        written = _write_new(staged / STATE, data)
        if held is not None:
            held.record = (handles.state_identity(written), dirs, root)
            held.blobs = blobs
        return None if parent is None else parent[0]
    except OSError as exc:
        raise _refusal(exc) from None


def _write_new(path: Path, data: bytes) -> os.stat_result:
    """A new file of ``data``; its fstat once written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        return os.fstat(fd)
    finally:
        os.close(fd)


def _delta(upper: str, out: str, before: Record, root_then: Ident, taken: int, root_st: os.stat_result,
           held: handles.Held | None = None) -> tuple[Record, list[str]]:
    """Copy into ``out`` every entry of ``upper`` not as in ``before`` (with the directories above
    it); the new record and what was deleted (top-most paths only). A directory the same as
    before (inode and ctime: no entry added, removed or renamed in it) lost nothing; its entries
    are each looked at all the same (a write in place moves no directory's times): through the
    helper's descriptor to the entry's inode where it holds one (``held``, handles.py), else by name."""
    walk = _Walk(upper, out, before, taken, root_st, held)
    root = _ident(root_st, taken)
    walk.pending.append(("", before.get("", {}), root == root_then and root[1] >= 0))
    while walk.pending:
        rel, then, same_dir = walk.pending.pop()
        walk.now[rel] = walk.same(rel, then) if same_dir else walk.listed(rel, then)
    if held is not None:
        held.keep_only(walk.now)  # directories gone: their descriptors would keep their files
    for copy, (source, st) in walk.made.items():
        copier.set_attributes(f"{out}/{copy}" if copy else out, st, source_path=source)
    return walk.now, sorted(walk.deleted)


_INO_CTIME = operator.attrgetter("st_ino", "st_ctime_ns")


class _Walk:
    """One delta walk of a live layer: what it found (``now``, ``deleted``), what it made in ``out``."""

    def __init__(self, upper: str, out: str, before: Record, taken: int, root_st: os.stat_result,
                 held: handles.Held | None) -> None:
        self.upper, self.out, self.before, self.held = upper, out, before, held
        self.grow = held is not None and held.populate  # open descriptors for entries without one
        self.dev = root_st.st_dev
        self.recent = taken - _RECENT_NS if _RECENT_NS else None
        self.dirs: dict[str, os.stat_result] = {"": root_st}
        self.made: Touched = {"": (upper, root_st)}
        self.links: dict[tuple[int, int], copier.StrPath] = {}
        self.now: Record = {}
        self.deleted: list[str] = []
        # (directory, its entries then, whether it is the same directory as then)
        self.pending: list[tuple[str, dict[str, Ident], bool]] = []
        os.mkdir(out, 0o700)

    def names(self, rel: str) -> dict[str, int] | None:
        """The descriptors held for the entries of directory ``rel`` (a new dict if the cache grows)."""
        if self.held is None:
            return None
        names = self.held.dirs.get(rel)
        if names is None and self.grow:
            names = self.held.dirs[rel] = {}
        return names

    def same(self, rel: str, then: dict[str, Ident]) -> dict[str, Ident]:
        """A directory the same as then: the same names, each the same inode, so each is looked at
        without listing it, by its descriptor if one is held (trusted only for the inode then: the
        same number; only descriptors on the layer's filesystem are kept), and an unchanged file
        costs that and one comparison (the cost of a checkpoint of a big layer: its record is
        then's, a directory with nothing changed keeps then's very dict). With a descriptor held
        for every entry, the whole directory is compared at once first (its row: ``unchanged``),
        and entry by entry only if something differs."""
        names = self.names(rel)
        if names and self.recent is None and self.held is not None:
            row = self.held.rows.get(rel)
            if row is None or row[0] is not then:
                row = self.row(rel, then, names)
            if row is not None and self.unchanged(row):
                return then
            self.held.rows.pop(rel, None)  # looked at entry by entry: its descriptors may be replaced
        if names is None:
            return self.same_by_name(rel, then)
        fstat, is_dir, recent = os.stat, stat.S_ISDIR, self.recent
        mine = then
        dfd = -1
        try:
            for name, old in then.items():
                fd = names.get(name)
                if fd is not None and (st := fstat(fd)).st_ino == old[0]:
                    if st.st_ctime_ns == old[1] and (recent is None or old[1] < recent) and not is_dir(st.st_mode):
                        continue
                else:
                    if fd is not None and self.held is not None:
                        self.held.close(names.pop(name))  # not of the inode the name had then
                    if dfd < 0:
                        dfd = os.open(f"{self.upper}/{rel}" if rel else self.upper, _DIR)
                    st = self.by_name(dfd, name, names)
                    if (st.st_ctime_ns == old[1] and st.st_ino == old[0] and (recent is None or old[1] < recent)
                            and not is_dir(st.st_mode)):
                        continue
                if mine is then:
                    mine = dict(then)
                self.visit(rel, name, st, old, mine)
        finally:
            if dfd >= 0:
                os.close(dfd)
        return mine

    def same_by_name(self, rel: str, then: dict[str, Ident]) -> dict[str, Ident]:
        """``same`` with no descriptor held (the first checkpoint of a layer in a process): an
        ``lstat`` by name per entry, in the leanest loop."""
        lstat, is_dir, recent = os.stat, stat.S_ISDIR, self.recent
        mine = then
        dfd = os.open(f"{self.upper}/{rel}" if rel else self.upper, _DIR)
        try:
            for name, old in then.items():
                st = lstat(name, dir_fd=dfd, follow_symlinks=False)
                ctime = st.st_ctime_ns
                if ctime == old[1] and st.st_ino == old[0] and (recent is None or ctime < recent) \
                        and not is_dir(st.st_mode):
                    continue
                if mine is then:
                    mine = dict(then)
                self.visit(rel, name, st, old, mine)
        finally:
            os.close(dfd)
        return mine

    def row(self, rel: str, then: dict[str, Ident], names: dict[str, int]) -> handles.Row | None:
        """The held row of directory ``rel`` (handles.Held.rows), if it has a descriptor per entry."""
        fds = [names.get(name, -1) for name in then]
        if -1 in fds or self.held is None:
            return None
        prefix = f"{rel}/" if rel else ""
        subdirs = [(i, prefix + name) for i, name in enumerate(then) if prefix + name in self.before]
        row = self.held.rows[rel] = (then, fds, list(then.values()), subdirs)
        return row

    def unchanged(self, row: handles.Row) -> bool:
        """Whether every entry of a held row is as recorded (each descriptor's inode and ctime);
        then its subdirectories are next."""
        _, fds, olds, subdirs = row
        found = list(map(os.stat, fds))
        if list(map(_INO_CTIME, found)) != olds:
            return False
        for i, path in subdirs:
            self.dirs[path] = found[i]
            self.pending.append((path, self.before.get(path, {}), True))
        return True

    def listed(self, rel: str, then: dict[str, Ident]) -> dict[str, Ident]:
        """A directory not the same as then: every name it has now, each looked at by the
        descriptor held for it if that is of the inode the name has, else by name; the names of
        then it no longer has are deleted."""
        if self.held is not None:
            self.held.rows.pop(rel, None)
        names = self.names(rel)
        kept = dict(names) if names else {}
        if names:
            names.clear()
        mine: dict[str, Ident] = {}
        dfd = os.open(f"{self.upper}/{rel}" if rel else self.upper, _DIR)
        try:
            with os.scandir(dfd) as entries:
                for entry in entries:
                    name = entry.name
                    fd = kept.pop(name, None)
                    if fd is not None and names is not None and (st := os.stat(fd)).st_ino == entry.inode():
                        names[name] = fd
                    else:
                        if fd is not None and self.held is not None:
                            self.held.close(fd)
                        st = self.by_name(dfd, name, names) if self.grow else entry.stat(follow_symlinks=False)
                    self.visit(rel, name, st, then.get(name), mine)
        finally:
            os.close(dfd)
        if self.held is not None:
            self.held.close_all(kept)  # names gone
        self.deleted.extend(f"{rel}/{name}" if rel else name for name in then if name not in mine)
        return mine

    def by_name(self, dfd: int, name: str, names: dict[str, int] | None) -> os.stat_result:
        """An entry's lstat by name, through a new descriptor kept for it if the cache grows."""
        if self.grow and names is not None and self.held is not None:
            fd = self.held.open(dfd, name)
            if fd is not None:
                st = os.stat(fd)
                if st.st_dev == self.dev:  # what is kept is of this filesystem: a row compares inodes only
                    names[name] = fd
                    return st
                self.held.close(fd)
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)

    def visit(self, rel: str, name: str, st: os.stat_result, old: Ident | None, mine: dict[str, Ident]) -> None:
        """An entry that is not as then, or a directory: record it, copy it if it changed."""
        ctime = st.st_ctime_ns
        if self.recent is not None and ctime >= self.recent:
            ctime = -1
        mine[name] = ident = (st.st_ino, ctime)
        same = old == ident and ctime >= 0
        path = f"{rel}/{name}" if rel else name
        if stat.S_ISDIR(st.st_mode):
            self.dirs[path] = st
            self.pending.append((path, self.before.get(path, {}), same))
            if not same:
                self.ensure(rel)
                os.mkdir(f"{self.out}/{path}", 0o700)
                self.made[path] = (f"{self.upper}/{path}", st)
        elif not same:
            self.ensure(rel)
            copier.copy_entry(f"{self.upper}/{path}", f"{self.out}/{path}", st, self.links, live=True)

    def ensure(self, rel: str) -> None:
        """The directory ``rel`` (and those above it) in out."""
        missing = []
        while rel not in self.made:
            missing.append(rel)
            rel = rel.rpartition("/")[0]
        for rel in reversed(missing):
            os.mkdir(f"{self.out}/{rel}", 0o700)
            self.made[rel] = (f"{self.upper}/{rel}", self.dirs[rel])


def changed_since(layer: Path, checkpoint: Path) -> bool | None:
    """Whether ``layer`` differs from what it was when ``checkpoint`` was taken of it (None: that
    checkpoint was not taken of this layer, or has no state). One lstat per entry at most."""
    state = read_state(checkpoint)
    if state is None or state[0] != layer_token(layer, create=False):
        return None
    before = state[3]
    upper = os.fspath(layer / "upper")
    if not _same(state[2], os.lstat(upper)):
        return True
    pending = [""]
    while pending:
        rel = pending.pop()
        then = before.get(rel)
        if then is None:
            return True
        count = 0
        with os.scandir(f"{upper}/{rel}" if rel else upper) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                if not _same(then.get(entry.name), st):
                    return True
                count += 1
                if stat.S_ISDIR(st.st_mode):
                    pending.append(f"{rel}/{entry.name}" if rel else entry.name)
        if count != len(then):
            return True
    return False


def _same(recorded: tuple[int, int] | None, st: os.stat_result) -> bool:
    return recorded is not None and recorded[1] >= 0 and recorded == (st.st_ino, st.st_ctime_ns)


# reading a chain -----------------------------------------------------------------------------
def chain(directory: Path, checkpoint_id: str) -> list[Path]:
    """The checkpoints ``checkpoint_id`` is made of, the full one first."""
    found: list[Path] = []
    current = checkpoint_id
    while True:
        path = directory / current
        if not path.is_dir():
            raise SandboxError(f"checkpoint {checkpoint_id} is unreadable: {current}, of its chain, is missing")
        found.append(path)
        delta = read_delta(path)
        if delta is None:
            return found[::-1]
        current = delta[0]
        if len(found) > 100_000 or any(p.name == current for p in found):
            raise SandboxError(f"checkpoint {checkpoint_id} is unreadable: its chain loops")


def materialize(directory: Path, checkpoint_id: str, target: Path, link: bool) -> None:
    """``target``: a layer (upper, empty work) with the files of the checkpoint, copies (a new
    layer) or hard links to the checkpoints' own files (``link``: a view, to be read only)."""
    try:
        os.mkdir(target, 0o700)
        os.mkdir(target / "work", 0o700)
        out = os.fspath(target / "upper")
        touched: Touched = {}
        for checkpoint in chain(directory, checkpoint_id):
            delta = read_delta(checkpoint)
            for rel in delta[1] if delta else ():
                _remove_at(out, rel, touched)
            _apply(os.fspath(checkpoint / "upper"), out, touched, link)
        _settle(touched)
    except OSError as exc:
        raise _refusal(exc) from None


def fold(directory: Path, checkpoint_id: str, child: str, staged: Path) -> None:
    """``staged``: ``child`` made independent of ``checkpoint_id`` (its parent), which is to be
    deleted: the two merged (hard links), a delta on the parent's parent or full as the parent was."""
    parent, kid = directory / checkpoint_id, directory / child
    above, below = read_delta(parent), read_delta(kid)
    if below is None or below[0] != checkpoint_id:
        raise SandboxError(f"checkpoint {child} is not a delta on {checkpoint_id}")
    try:
        os.mkdir(staged, 0o700)
        os.mkdir(staged / "work", 0o700)
        out = os.fspath(staged / "upper")
        touched: Touched = {}
        _apply(os.fspath(parent / "upper"), out, touched, link=True)
        for rel in below[1]:
            _remove_at(out, rel, touched)
        _apply(os.fspath(kid / "upper"), out, touched, link=True)
        _settle(touched)
        os.link(kid / STATE, staged / STATE)
        if above is not None:
            _write_delta(staged, above[0], sorted({*above[1], *below[1]}))
    except OSError as exc:
        raise _refusal(exc) from None


def children(directory: Path, checkpoint_id: str) -> list[str]:
    """The checkpoints that are deltas on ``checkpoint_id``."""
    found = []
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."):
            with contextlib.suppress(OSError, ValueError, KeyError):
                delta = read_delta(Path(entry.path))
                if delta is not None and delta[0] == checkpoint_id:
                    found.append(entry.name)
    return sorted(found)


def _apply(source: str, out: str, touched: Touched, link: bool) -> None:
    """Put every entry of ``source`` at its place under ``out``: a directory merged with one
    already there, anything else replacing what is there."""
    links: dict[tuple[int, int], copier.StrPath] = {}
    pending = [("", False)]  # (path, whether its directory is new here: nothing to replace in it)
    while pending:
        rel, fresh = pending.pop()
        src, dst = (f"{source}/{rel}", f"{out}/{rel}") if rel else (source, out)
        st = os.lstat(src)
        if stat.S_ISDIR(st.st_mode):
            made = fresh
            if fresh:
                os.mkdir(dst, 0o700)
            else:
                try:
                    here = os.lstat(dst)
                except FileNotFoundError:
                    os.mkdir(dst, 0o700)
                    made = True
                else:
                    if not stat.S_ISDIR(here.st_mode):
                        _remove(dst)
                        os.mkdir(dst, 0o700)
                        made = True
            touched[dst] = (src, st)
            with os.scandir(src) as entries:
                pending.extend((f"{rel}/{e.name}" if rel else e.name, made) for e in entries)
            continue
        if not fresh and os.path.lexists(dst):
            _remove(dst)
        if link:
            try:
                os.link(src, dst, follow_symlinks=False)
                continue
            except OSError as exc:
                if exc.errno != errno.EMLINK:
                    raise
        copier.copy_entry(src, dst, st, links)


def _remove_at(out: str, rel: str, touched: Touched) -> None:
    """Delete ``rel`` (and what is under it) from ``out``; its directory keeps its times."""
    path = f"{out}/{rel}"
    if not os.path.lexists(path):
        return
    above = os.path.dirname(path)
    if above not in touched:
        touched[above] = (None, os.lstat(above))
    _remove(path)


def _remove(path: str) -> None:
    if stat.S_ISDIR(os.lstat(path).st_mode):
        remove_tree(Path(path))  # at any depth
    else:
        os.unlink(path)


def _settle(touched: Touched) -> None:
    """The directories' own attributes, once their entries are all in place (the xattrs exactly
    the source's: an opaque marker may come or go)."""
    for path, (source, st) in touched.items():
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                continue  # replaced by a later checkpoint's file
        except (FileNotFoundError, NotADirectoryError):
            continue  # deleted by a later checkpoint (or what held it was)
        if source is not None:
            copier.copy_dir_xattrs(Path(source), Path(path))
        copier.set_attributes(path, st, source_path=None)


def describe(checkpoint: Path) -> dict[str, Any]:
    """What a checkpoint is made of (for tests and ``store`` output): full, or its parent."""
    delta = read_delta(checkpoint)
    return {"full": delta is None, "parent": None if delta is None else delta[0]}
