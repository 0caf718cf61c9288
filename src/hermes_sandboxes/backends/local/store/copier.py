"""Copy entries of an overlay layer the way ``cp -a`` does, without starting a process.

A checkpoint of a small change on ext4 copies a few files; starting ``cp`` (from the store's helper
in the user namespace) cost more than the copy itself. This copies in-process, with what a layer
needs kept: owners, modes (set after the owner: chown clears set-id bits), every xattr
(``user.overlay.*`` markers, ``security.capability``), times, symlinks, device nodes and
overlay whiteouts (character devices 0/0, which the kernel lets anyone make), holes, and hard links
among the entries copied in one call. Data moves with ``copy_file_range`` (in the kernel; shared
extents where the filesystem can). Like ``cp -a`` it goes by path: a tree nested deeper than
PATH_MAX raises OSError (ENAMETOOLONG).

``live``: the source is a live layer a checkpoint records by ctime (increment.py); each file copied
gets its writeback started (``start_writeback``), so that a write after the checkpoint through a
shared mapping made before it still moves the file's ctime.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from hermes_sandboxes.backends.local.guest import syscalls as sc

_CHUNK = 1 << 30
StrPath = str | Path


def copy_tree(source: Path, target: Path, seen: dict[str, os.stat_result] | None = None, live: bool = False) -> None:
    """``cp -a source target`` (``target`` must not exist). ``seen``, if given, gets the lstat of
    every entry copied, by its path relative to ``source`` (a checkpoint's manifest: no second walk)."""
    links: dict[tuple[int, int], StrPath] = {}
    dirs: list[tuple[str, str, os.stat_result]] = []
    # paths as strings: building Path objects cost more per small file than its syscalls
    pending = [(os.fspath(source), os.fspath(target), "")]
    while pending:
        src, dst, rel = pending.pop()
        st = os.lstat(src)
        if seen is not None and rel:
            seen[rel] = st
        copy_entry(src, dst, st, links, live)
        if stat.S_ISDIR(st.st_mode):
            dirs.append((src, dst, st))
            prefix = f"{rel}/" if rel else ""
            with os.scandir(src) as entries:
                pending.extend((e.path, f"{dst}/{e.name}", prefix + e.name) for e in entries)
    for src, dst, st in reversed(dirs):  # deepest first: filling a directory moved its times
        set_attributes(dst, st, source_path=src)


def copy_entries(source_root: Path, target_root: Path, rels: Iterable[str]) -> None:
    """Copy each non-directory ``rel`` of ``source_root`` to the same place under ``target_root``
    (whose parents exist); hard links among them are kept."""
    links: dict[tuple[int, int], StrPath] = {}
    for rel in rels:
        src = source_root / rel
        copy_entry(src, target_root / rel, os.lstat(src), links)


def copy_entry(src: StrPath, dst: StrPath, st: os.stat_result, links: dict[tuple[int, int], StrPath],
               live: bool = False) -> None:
    """One entry; a directory is made empty (its attributes are the caller's to set after filling)."""
    mode = st.st_mode
    key = (st.st_dev, st.st_ino)
    if stat.S_ISDIR(mode):
        os.mkdir(dst, 0o700)
        return
    if st.st_nlink > 1 and key in links:
        os.link(links[key], dst, follow_symlinks=False)
        return
    if stat.S_ISREG(mode):
        _copy_file(src, dst, st, live)
    else:
        if stat.S_ISLNK(mode):
            os.symlink(os.readlink(src), dst)
        else:  # devices, fifos, sockets; overlay whiteouts are character devices 0/0
            os.mknod(dst, stat.S_IFMT(mode) | 0o600, st.st_rdev)
        set_attributes(dst, st, source_path=src)
    if st.st_nlink > 1:
        links[key] = dst


def set_attributes(dst: StrPath, st: os.stat_result, source_path: StrPath | None) -> None:
    """Owner, mode, xattrs (from ``source_path``, or kept as they are when None) and times."""
    os.chown(dst, st.st_uid, st.st_gid, follow_symlinks=False)
    is_link = stat.S_ISLNK(st.st_mode)
    if not is_link:
        os.chmod(dst, stat.S_IMODE(st.st_mode))
    if source_path is not None:
        for name in os.listxattr(source_path, follow_symlinks=False):
            value = os.getxattr(source_path, name, follow_symlinks=False)
            try:
                os.setxattr(dst, name, value, follow_symlinks=False)
            except OSError:
                if not is_link:  # user.* xattrs cannot exist on symlinks; anything else must copy
                    raise
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def copy_dir_xattrs(src: Path, dst: Path) -> None:
    """Give directory ``dst`` exactly ``src``'s xattrs."""
    wanted = {name: os.getxattr(src, name, follow_symlinks=False) for name in os.listxattr(src, follow_symlinks=False)}
    for name in os.listxattr(dst, follow_symlinks=False):
        if name not in wanted:
            with contextlib.suppress(OSError):
                os.removexattr(dst, name, follow_symlinks=False)
    for name, value in wanted.items():
        os.setxattr(dst, name, value, follow_symlinks=False)


def _copy_file(src: StrPath, dst: StrPath, st: os.stat_result, live: bool) -> None:
    """A regular file with its data, owner, mode, xattrs and times, all through its two open
    descriptors (one path lookup each, where the path calls cost one per attribute)."""
    fin = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            if st.st_blocks * 512 >= st.st_size:  # no holes: one run from the start to the end
                while os.copy_file_range(fin, fout, _CHUNK):
                    pass
            else:
                _copy_runs(fin, fout, st.st_size)
            os.fchown(fout, st.st_uid, st.st_gid)
            os.fchmod(fout, stat.S_IMODE(st.st_mode))  # after the owner: chown clears set-id bits
            for name in os.listxattr(fin):
                os.setxattr(fout, name, os.getxattr(fin, name))
            os.utime(fout, ns=(st.st_atime_ns, st.st_mtime_ns))
            if live:
                sc.start_writeback(fin)
        finally:
            os.close(fout)
    finally:
        os.close(fin)


def _copy_runs(fin: int, fout: int, size: int) -> None:
    """The data runs of a sparse file only: holes stay holes."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fin, offset, os.SEEK_DATA)
        except OSError:
            break  # no data after offset (ENXIO): the rest is a hole
        end = os.lseek(fin, start, os.SEEK_HOLE)
        position = start
        while position < end:
            copied = os.copy_file_range(fin, fout, min(end - position, _CHUNK), position, position)
            if copied == 0:
                break
            position += copied
        offset = end
    os.ftruncate(fout, size)
