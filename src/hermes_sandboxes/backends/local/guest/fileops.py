"""File operations run by a forked child of init, inside the sandbox's root.

Running them in the sandbox (not through /proc/PID/root from the host) means every path, symlinks
included, resolves inside the sandbox: a link to /etc/shadow reaches the sandbox's file, never the
host's. Content streams through the child's stdin/stdout, so file size does not cost memory.
The child holds no more capabilities than a command (init.py cuts them before calling ``run``),
reads only regular files (a FIFO would block it, a device or another process's descriptor under
/proc is not a file's content), and is killed by an alarm after ``TIMEOUT_S``.
Exit codes: 0 ok, 2 not found, 21 is a directory, 1 anything else (message on stderr).
"""

from __future__ import annotations

import errno
import os
import stat

TYPE_CHECKING = False  # typing is not imported at run time: it slows the init's start
if TYPE_CHECKING:
    from typing import Any

NOT_FOUND = 2
IS_DIRECTORY = 21
TIMEOUT_S = 300  # the helper's own deadline; the host gives up a little later (sandbox.py)
_CHUNK = 1 << 20


def _copy(src: int, dst: int) -> None:
    while chunk := os.read(src, _CHUNK):
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view):]


def _read(path: str) -> None:
    # O_PATH opens nothing (no FIFO wait, no device open): the type is checked on that handle,
    # then the same inode is opened for reading through it, so a swap in between changes nothing.
    handle = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        mode = os.fstat(handle).st_mode
        if stat.S_ISDIR(mode):
            raise OSError(errno.EISDIR, os.strerror(errno.EISDIR))
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "not a regular file")
        fd = os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC)
    finally:
        os.close(handle)
    try:
        _copy(fd, 1)
    finally:
        os.close(fd)


def _write(path: str, mode: int) -> None:
    parent = os.path.dirname(path) or "/"
    os.makedirs(parent, 0o755, exist_ok=True)  # the contract: a write creates missing parents
    tmp = os.path.join(parent, f".hs-write-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        _copy(0, fd)
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.rename(tmp, path)  # readers see the old file or the new one, never half of it


def run(name: str, message: dict[str, Any]) -> int:
    path = str(message.get("path", ""))
    if not path.startswith("/"):
        os.write(2, f"path must be absolute: {path!r}\n".encode())
        return 1
    try:
        if name == "read":
            _read(path)
        elif name == "write":
            _write(path, int(message.get("mode", 0o644)) & 0o7777)
        elif name == "delete":
            os.unlink(path)
        else:
            os.write(2, f"unknown file operation {name!r}\n".encode())
            return 1
    except OSError as exc:
        os.write(2, f"{path}: {exc.strerror}\n".encode())
        if exc.errno == errno.ENOENT:
            return NOT_FOUND
        if exc.errno == errno.EISDIR:
            return IS_DIRECTORY
        return 1
    return 0
