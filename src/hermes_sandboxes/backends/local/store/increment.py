"""Checkpoints of an overlay layer that copy only what changed since the previous checkpoint.

Without snapshots or reflinks (ext4), a checkpoint is a copy of the sandbox's writable layer: the
files it changed since it was created. Copying that whole layer at every checkpoint makes a
checkpoint after a small change cost all the earlier ones again. Here a checkpoint starts as a tree
of hard links to the files of the previous checkpoint of the same layer (``cp -al``: cost per file,
none per byte), then takes a fresh copy of each file the sandbox changed since, and drops what it
deleted. Checkpoints are never written after they are made, so sharing an inode between two of
them is safe; a live layer never shares one with a checkpoint (an in-place append would leak into
it), and a restore or fork is a full copy.

What changed is told by a manifest written with each checkpoint: every entry of the live layer
then, with its inode, ctime, size, mtime and mode. The kernel moves a file's ctime on every change
of its data or metadata and no caller can set it, so an entry that is the same inode with the same
ctime is unchanged. A manifest only speaks for the layer it was taken of (its upper directory's
inode): after a restore the layer is a new copy, and its first checkpoint is a full copy again.
Directories are made anew by ``cp -al``; their owners, modes, xattrs (``user.overlay.opaque``) and
times are set from the live layer wherever something in or under them changed.

Runs as root of the sandbox's user namespace (``mapped``): the layer holds inner users' files.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import time
from pathlib import Path

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
                found[path] = (st.st_ino, st.st_ctime_ns, st.st_size, st.st_mtime_ns, st.st_mode)
                if stat.S_ISDIR(st.st_mode):
                    pending.append(path)
    return found


def _previous(candidates: list[tuple[Path, Path]], ident: list[int]) -> tuple[Path, dict[str, Stat]] | None:
    """The newest (checkpoint, manifest) taken of this very layer, if any."""
    best: tuple[int, Path, dict[str, Stat]] | None = None
    for checkpoint, manifest in candidates:
        try:
            data = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        if data.get("upper") != ident or not checkpoint.is_dir():
            continue
        if best is None or data["taken"] > best[0]:
            files = {rel: (v[0], v[1], v[2], v[3], v[4]) for rel, v in data["files"].items()}
            best = (data["taken"], checkpoint, files)
    return None if best is None else (best[1], best[2])


def _run(argv: list[str], cwd: Path | None = None) -> None:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise SandboxError(f"{argv[0]} {argv[1]} failed: {detail[-1][-300:] if detail else proc.returncode}")


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
    now = scan(upper)
    previous = _previous(candidates, ident)
    if previous is None:
        copy_layer(layer, staged)
    else:
        _run(["cp", "-al", str(previous[0]), str(staged)])
        _apply(upper, staged / "upper", now, previous[1])
    staged_manifest = manifest.with_name(f".tmp-{manifest.name}")
    staged_manifest.write_text(json.dumps({"upper": ident, "taken": time.time_ns(), "files": now}))
    staged_manifest.rename(manifest)
    return previous is not None


def copy_layer(source: Path, target: Path) -> None:
    """``cp -a source target``, in-process (copier.py); SandboxError if it cannot be copied."""
    try:
        copier.copy_tree(source, target)
    except OSError as exc:
        raise _refusal(exc) from None


def _remove(path: Path) -> None:
    if not os.path.lexists(path):
        return
    if os.path.isdir(path) and not os.path.islink(path):
        _run(["rm", "-rf", "--", str(path)])
    else:
        os.unlink(path)


def _apply(live: Path, target: Path, now: dict[str, Stat], before: dict[str, Stat]) -> None:
    """Turn ``target`` (the previous checkpoint's links) into ``live`` as it is now."""
    touched: set[str] = set()  # directories whose entries or attributes we change
    for rel in sorted(before.keys() - now.keys()):
        _remove(target / rel)
        touched.add(os.path.dirname(rel))
    changed: list[str] = []
    for rel in sorted(now):  # parents before children
        st, old = now[rel], before.get(rel)
        if stat.S_ISDIR(st[4]):
            if old is None or not stat.S_ISDIR(old[4]):
                _remove(target / rel)
                os.mkdir(target / rel)
                touched.add(rel)
                touched.add(os.path.dirname(rel))
            elif old[1] != st[1]:
                touched.add(rel)
            continue
        if old == st:
            continue  # the same inode, unchanged: the link to the previous copy stands
        _remove(target / rel)
        changed.append(rel)
        touched.add(os.path.dirname(rel))
    copier.copy_entries(live, target, changed)
    for rel in sorted(touched, key=lambda p: p.count("/") if p else -1, reverse=True):
        source, copy = (live / rel, target / rel) if rel else (live, target)
        copier.set_attributes(copy, os.lstat(source), source_path=None)
        copier.copy_dir_xattrs(source, copy)


