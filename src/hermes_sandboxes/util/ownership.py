"""Directories this program keeps its own files in (a store home, the host state) must be its own.

Root formats, mounts and writes files inside a store home; journals and audit logs go into the
state directory. If another local user made such a directory (or can replace it), they choose what
those names point to: a ``store.tmp`` linked to a root-owned file was truncated to 64 GiB and
formatted. So a directory is trusted only when it and every directory above it is owned by root or
by the running user, the directory itself is writable by nobody else, and no directory above it is
writable by others unless sticky (as /tmp is: there nobody can rename or remove what is not theirs).
Symlinks on the way must be owned by root or the running user too. What is missing is created one
component at a time with ``mkdir`` (which never follows a symlink in the last component), then
checked like the rest.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


class Untrusted(Exception):
    """The directory, or one above it, may be controlled by someone else."""


def _trusted_owner(uid: int) -> bool:
    return uid in (0, os.geteuid())


def _check_component(path: str, st: os.stat_result, leaf: bool, what: str) -> None:
    if not _trusted_owner(st.st_uid):
        raise Untrusted(f"{what} {path} is owned by uid {st.st_uid}, neither root nor this user "
                        f"(uid {os.geteuid()}): someone else could choose what it holds")
    if not stat.S_ISDIR(st.st_mode):
        raise Untrusted(f"{what} {path} is not a directory")
    others_write = st.st_mode & 0o022
    if leaf and others_write:
        raise Untrusted(f"{what} {path} is writable by its group or others (mode {stat.S_IMODE(st.st_mode):o}); "
                        "make it writable by its owner alone (chmod go-w)")
    if not leaf and others_write and not st.st_mode & stat.S_ISVTX:
        raise Untrusted(f"{path}, above {what}, is writable by others and not sticky: its entries can be "
                        "replaced; choose a directory under one only root or this user can write")


def _walk_symlinks(path: str, what: str) -> None:
    """Every symlink on the way to ``path`` belongs to root or this user (others' could be re-pointed)."""
    current = "/"
    for part in Path(path).parts[1:]:
        current = os.path.join(current, part)
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            if not _trusted_owner(st.st_uid):
                raise Untrusted(f"{what} {path} goes through the symlink {current}, owned by uid {st.st_uid}")
            current = os.path.realpath(current)


def check_dir(path: str | os.PathLike[str], what: str) -> None:
    """Untrusted unless ``path`` (which must exist) and the directories above it are safe (see above)."""
    text = os.path.abspath(path)
    _walk_symlinks(text, what)
    real = os.path.realpath(text)
    parts = Path(real).parts
    for depth in range(1, len(parts) + 1):
        component = os.path.join(*parts[:depth])
        _check_component(component, os.lstat(component), depth == len(parts), what)


def ensure_dir(path: str | os.PathLike[str], what: str, mode: int = 0o700) -> Path:
    """``path`` checked as check_dir does, its missing components made first (the last with
    ``mode``, those above it 0755), each refused if someone else's directory is in the way."""
    text = os.path.abspath(path)
    _walk_symlinks(text, what)
    real = Path(os.path.realpath(text))
    missing = []
    probe = real
    while not os.path.lexists(probe):
        missing.append(probe)
        probe = probe.parent
    if probe == real:
        check_dir(probe, what)
        return real  # nothing made: that was the whole check (a warm exec's worker paid it twice)
    _check_above(probe, what)
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile: checked below like any other
            os.mkdir(directory, mode if directory == real else 0o755)
    check_dir(real, what)
    return real


def _check_above(path: Path, what: str) -> None:
    """The existing directory ``path`` holds what will be made: trusted as a parent."""
    parts = path.parts
    for depth in range(1, len(parts) + 1):
        component = os.path.join(*parts[:depth])
        _check_component(component, os.lstat(component), False, what)
