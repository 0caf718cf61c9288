"""Writing sandbox-authored files into a host tree without ever following a symlink.

A path-name write (``open(home / rel, "w")``) follows every symlink on the way: a link planted in the
tree (by a sync, by the agent through an earlier pull, by anyone) turns the write into one outside
the tree. Here the tree's root is opened once and every directory below it relative to its parent's
descriptor with ``O_NOFOLLOW``; a final file is created under a private temporary name with
``O_EXCL | O_NOFOLLOW`` and linked into place with ``link()``, which never replaces an existing
entry. So a symlink anywhere below the root makes the write fail (``Redirected``), never go
elsewhere, and a file appears complete or not at all.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


class Redirected(OSError):
    """A directory on the way is a symlink (or the root is not where it should be)."""


class Blocked(OSError):
    """The host cannot hold this path: an ancestor is a regular file, a name too long, no access."""


class Tree:
    """A host directory opened by descriptor; paths below it are relative POSIX paths."""

    def __init__(self, root: str | os.PathLike[str], fd: int | None = None) -> None:
        """Open ``root`` (following a symlink at ``root`` itself: it names the tree), or adopt
        ``fd``, a descriptor of it opened by a walk."""
        self.root = Path(root)
        self._fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if fd is None else fd

    @property
    def fd(self) -> int:
        """The root's descriptor (owned by the tree)."""
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Tree:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def open_dir(self, parts: Iterable[str], *, create: bool) -> int:
        """A new descriptor of the directory ``parts`` below the root (the caller closes it),
        made (mode 0700) where missing when ``create``. Raises Redirected on a symlink on the way,
        Blocked when it cannot exist (FileNotFoundError when missing and not ``create``)."""
        fd = os.dup(self._fd)
        for name in parts:
            fd = _step(fd, name, create=create)  # closes the descriptor it is given, even when it fails
        return fd

    def subtree(self, parts: list[str], *, create: bool) -> Tree:
        """The directory ``parts`` below the root as a Tree of its own (opened like ``open_dir``)."""
        return Tree(self.root.joinpath(*parts), self.open_dir(parts, create=create))

    def lstat(self, dir_fd: int, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None


def _step(fd: int, name: str, *, create: bool) -> int:
    """Open ``name`` below directory ``fd`` (closing ``fd``), never through a symlink."""
    try:
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise
            with contextlib.suppress(FileExistsError):  # made meanwhile: opened below, same checks
                os.mkdir(name, 0o700, dir_fd=fd)
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            os.close(fd)
            raise
        # O_DIRECTORY | O_NOFOLLOW fails on a symlink with ENOTDIR (or ELOOP): look at what it is
        try:
            link = stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
        except OSError:
            link = False
        os.close(fd)
        if link or exc.errno == errno.ELOOP:
            raise Redirected(errno.ELOOP, f"{name} is a symlink") from exc
        raise Blocked(exc.errno, f"{name}: {exc.strerror}") from exc
    os.close(fd)
    return child


def same_content(dir_fd: int, name: str, source: int, start: int, size: int) -> bool:
    """Whether regular file ``name`` holds exactly the ``size`` bytes of descriptor ``source`` from
    offset ``start``; reads it without following a symlink."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or os.fstat(fd).st_size != size:
            return False
        offset = 0
        while offset < size:
            mine = os.pread(fd, _CHUNK, offset)
            theirs = os.pread(source, len(mine), start + offset)
            if not mine or mine != theirs:
                return False
            offset += len(mine)
        return True
    finally:
        os.close(fd)


def create_file(dir_fd: int, name: str, source: int, start: int, size: int, mode: int) -> None:
    """Create ``name`` in directory ``dir_fd`` with the ``size`` bytes of descriptor ``source`` from
    offset ``start``. Never replaces an existing entry (FileExistsError) and never leaves a partial
    file under ``name``."""
    temp = f".hs-{secrets.token_hex(6)}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        try:
            offset = 0
            while offset < size:
                chunk = os.pread(source, min(_CHUNK, size - offset), start + offset)
                if not chunk:
                    raise OSError(errno.EIO, "the recovered file is shorter than its archive entry")
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
                offset += len(chunk)
            os.fchmod(fd, mode & 0o755)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.link(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=dir_fd)
