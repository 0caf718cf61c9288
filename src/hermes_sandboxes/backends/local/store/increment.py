"""Checkpoints of an overlay layer that copy only what changed since the previous checkpoint.

Without snapshots or reflinks (ext4), a checkpoint is a copy of the sandbox's writable layer: the
files it changed since it was created. Copying that whole layer at every checkpoint makes a
checkpoint after a small change cost all the earlier ones again. Here a checkpoint is made in one
walk of the live layer: an entry unchanged since the previous checkpoint of the same layer becomes
a hard link to that checkpoint's copy (a stat and a link: cost per file, none per byte), a changed
one a fresh copy, and what the sandbox deleted is not there. Checkpoints are never written after
they are made, so sharing an inode between two of them is safe; a live layer never shares one with
a checkpoint (an in-place append would leak into it), and a restore or fork is a full copy.

What changed is told by a manifest written with each checkpoint: every entry of the live layer
then, with its inode, ctime, size, mtime and mode. The kernel moves a file's ctime on every change
of its data or metadata and no caller can set it, so an entry that is the same inode with the same
ctime is unchanged. A manifest only speaks for the layer it was taken of (its upper directory's
inode): after a restore the layer is a new copy, and its first checkpoint is a full copy again.
Directories are made anew, with the live layer's owners, modes, xattrs (``user.overlay.opaque``)
and times.

Runs as root of the sandbox's user namespace (``mapped``): the layer holds inner users' files.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

from hermes_sandboxes.backends.local.store import copier
from hermes_sandboxes.errors import SandboxError

Stat = tuple[int, int, int, int, int]  # inode, ctime_ns, size, mtime_ns, mode


def _ident(upper: Path) -> list[int]:
    st = os.lstat(upper)
    return [st.st_dev, st.st_ino]


def scan(root: Path) -> dict[str, Stat]:
    """Every entry under ``root`` (relative paths), never following a symlink."""
    found: dict[str, Stat] = {}
    pending = [""]
    while pending:
        rel = pending.pop()
        with os.scandir(root / rel if rel else root) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                path = f"{rel}/{entry.name}" if rel else entry.name
                found[path] = _entry(st)
                if stat.S_ISDIR(st.st_mode):
                    pending.append(path)
    return found


def _entry(st: os.stat_result) -> Stat:
    return st.st_ino, st.st_ctime_ns, st.st_size, st.st_mtime_ns, st.st_mode


def _previous(candidates: list[tuple[Path, Path]], ident: list[int]) -> tuple[Path, dict[str, Stat]] | None:
    """The newest (checkpoint, manifest) taken of this very layer, if any. Manifests are read newest
    file first, and only those written within a second of the newest match (file times are
    coarse: a tie is settled by the time recorded inside), not every checkpoint's."""
    dated = []
    for checkpoint, manifest in candidates:
        try:
            dated.append((os.stat(manifest).st_mtime_ns, checkpoint, manifest))
        except OSError:
            continue
    dated.sort(key=lambda item: item[0], reverse=True)
    best: tuple[int, Path, dict[str, Any]] | None = None
    newest_match: int | None = None
    for written, checkpoint, manifest in dated:
        if newest_match is not None and written < newest_match - 1_000_000_000:
            break
        try:
            data = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        if data.get("upper") != ident or not checkpoint.is_dir():
            continue
        newest_match = written if newest_match is None else newest_match
        if best is None or data["taken"] > best[0]:
            best = (data["taken"], checkpoint, data["files"])
    if best is None:
        return None
    return best[1], {rel: (v[0], v[1], v[2], v[3], v[4]) for rel, v in best[2].items()}


def checkpoint(layer: Path, staged: Path, candidates: list[tuple[Path, Path]], manifest: Path) -> bool:
    """Make ``staged`` a copy of ``layer`` and write its manifest; True when it was made from a
    previous checkpoint (``candidates``: (checkpoint, manifest) pairs of the sandbox)."""
    try:
        return _checkpoint(layer, staged, candidates, manifest)
    except OSError as exc:
        raise _refusal(exc) from None


def unchanged(layer: Path, manifest: Path) -> bool | None:
    """Whether ``layer`` is entry for entry what it was when ``manifest`` was written (None: the
    manifest speaks for another layer, or cannot be read). Costs one lstat per entry."""
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return None
    upper = layer / "upper"
    if data.get("upper") != _ident(upper):
        return None
    then = {rel: tuple(v) for rel, v in data["files"].items()}
    return scan(upper) == then


def _refusal(exc: OSError) -> SandboxError:
    why = exc.strerror or str(exc)
    if exc.errno == errno.ENAMETOOLONG:  # cp -a fails there as well: it copies by path too
        why += " (the layer nests directories deeper than a path can name; only the btrfs stores take that)"
    return SandboxError(f"copying the layer failed: {why}")


def _checkpoint(layer: Path, staged: Path, candidates: list[tuple[Path, Path]], manifest: Path) -> bool:
    upper = layer / "upper"
    ident = _ident(upper)
    previous = _previous(candidates, ident)
    if previous is None:  # the manifest from the copy's own walk
        seen: dict[str, os.stat_result] = {}
        copy_layer(layer, staged, seen)
        now = {rel[len("upper/"):]: _entry(st) for rel, st in seen.items() if rel.startswith("upper/")}
    else:
        now = _link_or_copy(layer, staged, previous[0], previous[1])
    staged_manifest = manifest.with_name(f".tmp-{manifest.name}")
    staged_manifest.write_text(json.dumps({"upper": ident, "taken": time.time_ns(), "files": now}))
    staged_manifest.rename(manifest)
    return previous is not None


def copy_layer(source: Path, target: Path, seen: dict[str, os.stat_result] | None = None) -> None:
    """``cp -a source target``, in-process (copier.py); SandboxError if it cannot be copied."""
    try:
        copier.copy_tree(source, target, seen)
    except OSError as exc:
        raise _refusal(exc) from None


def _link_or_copy(layer: Path, staged: Path, previous: Path, before: dict[str, Stat]) -> dict[str, Stat]:
    """Make ``staged`` a copy of ``layer`` in one walk of its upper directory: each entry the same
    as in ``before`` (the manifest of ``previous``, a checkpoint) is a hard link to that
    checkpoint's copy, anything else a fresh copy; what was deleted since is simply not there.
    Returns the new manifest. Costs a stat and a link per unchanged entry, a copy per changed one."""
    os.mkdir(staged, 0o700)
    copier.copy_tree(layer / "work", staged / "work")
    live_root, copy_root = os.fspath(layer / "upper"), os.fspath(staged / "upper")
    old_root = os.fspath(previous / "upper")
    now: dict[str, Stat] = {}
    links: dict[tuple[int, int], copier.StrPath] = {}
    os.mkdir(copy_root, 0o700)
    dirs = [(live_root, copy_root, os.lstat(live_root))]
    pending = [""]
    while pending:
        rel = pending.pop()
        with os.scandir(f"{live_root}/{rel}" if rel else live_root) as entries:
            for entry in entries:
                path = f"{rel}/{entry.name}" if rel else entry.name
                st = entry.stat(follow_symlinks=False)
                now[path] = found = _entry(st)
                copy = f"{copy_root}/{path}"
                if stat.S_ISDIR(st.st_mode):
                    os.mkdir(copy, 0o700)
                    dirs.append((entry.path, copy, st))
                    pending.append(path)
                    continue
                if before.get(path) == found and _linked(f"{old_root}/{path}", copy):
                    continue  # the same inode, unchanged: the previous copy serves
                copier.copy_entry(entry.path, copy, st, links)
    for source, copy, st in reversed(dirs):  # deepest first: filling a directory moved its times
        copier.set_attributes(copy, st, source_path=source)
    copier.set_attributes(staged, os.lstat(layer), source_path=layer)
    return now


def _linked(old: str, new: str) -> bool:
    """Hard-link ``old`` as ``new``; False when that copy is gone or has all the links it can."""
    try:
        os.link(old, new, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EMLINK):
            return False
        raise
    return True
