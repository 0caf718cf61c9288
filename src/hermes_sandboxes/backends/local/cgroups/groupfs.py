"""Operations on one cgroup directory, for either version: freeze, thaw, kill every process, remove.

A group of the v1 freezer hierarchy has ``freezer.state``; a v2 group has ``cgroup.freeze`` (and
``cgroup.kill`` from Linux 5.14). Each operation looks at which file the group has, so callers
that only hold a path (a command's group, say) need not know the version.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from pathlib import Path

from hermes_sandboxes.errors import SandboxError

# A group removed while we look at it (the init removes an exec's group as soon as it is empty)
# answers ENOENT, or ENODEV for a file opened just before the removal: both mean "no processes".
_GONE = (errno.ENOENT, errno.ENODEV)


def write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def read(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 4096).decode().strip()
    finally:
        os.close(fd)


def _is_v1(group: Path) -> bool:
    return (group / "freezer.state").exists()


def procs(group: Path) -> list[int]:
    """Every process in ``group`` and its descendants."""
    pids: list[int] = []
    for root, _dirs, _files in os.walk(group):
        try:
            with open(os.path.join(root, "cgroup.procs")) as f:
                pids.extend(int(p) for p in f.read().split())
        except OSError as exc:
            if exc.errno not in _GONE:
                raise
    return pids


def _frozen_now(group: Path) -> bool:
    if _is_v1(group):
        return read(group / "freezer.state") == "FROZEN"
    return "frozen 1" in read(group / "cgroup.events").splitlines()


def freeze(group: Path, timeout: float = 5.0) -> None:
    if _is_v1(group):
        write(group / "freezer.state", "FROZEN")
    else:
        write(group / "cgroup.freeze", "1")
    deadline = time.monotonic() + timeout
    while not _frozen_now(group):
        if time.monotonic() > deadline:
            thaw(group)
            raise SandboxError(f"could not freeze {group} within {timeout:.0f}s; try again")
        time.sleep(0.0005)


def is_frozen(group: Path) -> bool:
    """Whether a freeze was asked for (and not undone) on ``group`` itself."""
    if _is_v1(group):
        return read(group / "freezer.state") != "THAWED"
    return read(group / "cgroup.freeze") == "1"


def thaw(group: Path) -> None:
    try:
        if _is_v1(group):
            write(group / "freezer.state", "THAWED")
        else:
            write(group / "cgroup.freeze", "0")
    except OSError as exc:
        if exc.errno not in _GONE:
            raise


def kill_group(group: Path, timeout: float = 10.0, *, reaped: bool = True) -> None:
    """SIGKILL every process in ``group`` and below, and wait until they have left it.

    v2 with ``cgroup.kill``: the kernel kills the whole subtree at once, forks in flight included.
    Otherwise: freeze (so nothing can fork away), SIGKILL each process, thaw, until empty. With
    ``reaped``, also wait (briefly) until the killed processes are reaped, not only dead."""
    if not group.is_dir():
        return
    killed: set[int] = set()
    if (group / "cgroup.kill").exists() and not _is_v1(group):
        _kill_v2(group, timeout, killed)
    else:
        _kill_v1(group, timeout, killed)
    if reaped:
        _wait_reaped(killed, time.monotonic() + 2.0)


def _kill_v1(group: Path, timeout: float, killed: set[int]) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            freeze(group)
        except OSError as exc:
            if exc.errno in _GONE:
                return
            raise
        for pid in procs(group):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        thaw(group)
        if not procs(group):
            return
        if time.monotonic() > deadline:
            raise SandboxError(f"processes in {group} survived SIGKILL for {timeout:.0f}s")
        time.sleep(0.002)


def _wait_reaped(pids: set[int], deadline: float) -> None:
    """A killed process leaves its group when it dies, but stays a zombie (seen by ``ps`` inside)
    until its parent reaps it: the sandbox's init, for a command's processes, does so at once.
    (Not for the init itself, whose parent is outside the sandbox: see ``reaped``.)"""
    while pids and time.monotonic() < deadline:
        pids = {pid for pid in pids if os.path.exists(f"/proc/{pid}")}
        if pids:
            time.sleep(0.002)


def _kill_v2(group: Path, timeout: float, killed: set[int]) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            killed.update(procs(group))
            write(group / "cgroup.kill", "1")
        except OSError as exc:
            if exc.errno in _GONE:
                return
            raise
        if not procs(group):
            return
        if time.monotonic() > deadline:
            raise SandboxError(f"processes in {group} survived cgroup.kill for {timeout:.0f}s")
        time.sleep(0.002)


def remove_tree(group: Path) -> None:
    """Remove ``group`` and its descendants (deepest first); they must hold no process."""
    try:  # the directory entries' types say which are groups: no stat of every control file
        children = sorted((e.path for e in os.scandir(group) if e.is_dir(follow_symlinks=False)), reverse=True)
    except FileNotFoundError:
        return
    for child in children:
        remove_tree(Path(child))
    deadline = time.monotonic() + 5
    while True:
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:  # EBUSY until the last killed task is reaped
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.005)
