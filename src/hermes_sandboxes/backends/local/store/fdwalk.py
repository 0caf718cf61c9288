"""Reading a directory tree that its sandbox may be changing, without ever leaving it.

A walk by path names can be led out of the tree: the sandbox swaps a directory for a symlink to
a host directory between the moment the walk lists it and the moment it descends into it, and the
walk goes on in the host's files. Here every directory is opened relative to its parent's
descriptor with O_NOFOLLOW, and everything else is read relative to a directory descriptor with
no symlink following, so a swap at any moment can only make an entry look vanished.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_OPEN = 128  # directories kept open along the current path (trees can be thousands deep)


def _within(rel: str, ancestor: str) -> bool:
    return rel == ancestor or rel.startswith(ancestor + "/")


def join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


class Tree:
    """A directory tree opened by descriptor; paths are relative to its root ("" is the root)."""

    def __init__(self, root: Path) -> None:
        self._root = os.open(root, _DIR_FLAGS)
        self._chain: list[tuple[str, int]] = []  # open directories, each inside the one before

    def close(self) -> None:
        for _, fd in self._chain:
            os.close(fd)
        self._chain.clear()
        os.close(self._root)

    def __enter__(self) -> Tree:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def dir_fd(self, rel: str) -> int | None:
        """A descriptor of directory ``rel`` (owned by the tree), or None if it is not one."""
        if not rel:
            return self._root
        chain = self._chain
        while chain and not _within(rel, chain[-1][0]):
            os.close(chain.pop()[1])
        if chain and chain[-1][0] == rel:
            return chain[-1][1]
        base, fd = chain[-1] if chain else ("", self._root)
        for name in (rel[len(base) + 1:] if base else rel).split("/"):
            base = join(base, name)
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                return None
            chain.append((base, fd))
            if len(chain) > _MAX_OPEN:  # reopened from an ancestor if ever needed again
                os.close(chain.pop(0)[1])
        return fd

    def entries(self, rel: str) -> list[tuple[str, os.stat_result]] | None:
        """Names and lstat results in directory ``rel``, or None if it is not a directory."""
        fd = self.dir_fd(rel)
        if fd is None:
            return None
        found = []
        try:
            with os.scandir(fd) as listing:
                for item in listing:
                    try:
                        found.append((item.name, item.stat(follow_symlinks=False)))
                    except OSError:
                        continue  # gone since it was listed
        except OSError:
            return None
        return found

    def names(self, rel: str) -> dict[str, int] | None:
        """Names in directory ``rel`` with their inode numbers (no stat), or None if not a directory."""
        fd = self.dir_fd(rel)
        if fd is None:
            return None
        try:
            with os.scandir(fd) as listing:
                return {item.name: item.inode() for item in listing}
        except OSError:
            return None

    def lstat(self, rel: str, name: str) -> os.stat_result | None:
        fd = self.dir_fd(rel)
        if fd is None:
            return None
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return None

    def walk(self, rel: str = "") -> Iterator[tuple[str, os.stat_result]]:
        """Everything below ``rel``, depth first."""
        stack = [rel]
        while stack:
            directory = stack.pop()
            for name, st in self.entries(directory) or ():
                path = join(directory, name)
                yield path, st
                if stat.S_ISDIR(st.st_mode):
                    stack.append(path)

    def readlink(self, rel: str) -> str | None:
        parent, _, name = rel.rpartition("/")
        fd = self.dir_fd(parent)
        if fd is None:
            return None
        try:
            return os.readlink(name, dir_fd=fd)
        except OSError:
            return None

    def dir_xattr(self, rel: str, attribute: str) -> bytes | None:
        """An extended attribute of directory ``rel`` (None if absent or not a directory)."""
        fd = self.dir_fd(rel)
        if fd is None:
            return None
        try:
            return os.getxattr(fd, attribute)
        except OSError:
            return None
