"""Old layers removed in the background, so that a restore does not wait for them (issue 24).

On a store whose removals walk the files (the copy store, the rootless overlay and reflink
stores), deleting a restored-over layer of 100,000 files took longer than the restore itself. The
old layer is moved instead into the store's ``.trash`` directory (same filesystem: one rename) and
a detached sweeper process empties it. ``.trash`` is never a sandbox name (names start with a
letter or digit), no sandbox or checkpoint is ever in it, and a sweeper killed midway only leaves
entries there, which the next store open sweeps again.

The sweeper works relative to its working directory (``.trash``), holds an flock on it while it
sweeps, removes it once it is empty (a rename into it then fails and is tried again), and lists
it again before it exits: a rename made while it swept is seen by it or by the
sweeper started after that rename, which waits for the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
from pathlib import Path

NAME = ".trash"

# Self-contained (started with -I -S: no module path of the caller's, no site).
_SWEEPER = r"""
import fcntl, os, subprocess
fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
fcntl.flock(fd, fcntl.LOCK_EX)
tried = set()
while True:
    names = [n for n in os.listdir(".") if n not in tried]
    if not names:
        try:
            os.rmdir(os.getcwd())  # an empty trash goes (a rename into it meanwhile: not empty)
            break
        except FileNotFoundError:
            break  # removed by the sweeper before this one
        except OSError:
            if not [n for n in os.listdir(".") if n not in tried]:
                break  # only what rm could not remove: left for the next open
            continue
    tried.update(names)
    subprocess.run(["rm", "-rf", "--", *names], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)
"""


def move(root: Path, volume: Path) -> bool:
    """Move ``volume`` into ``root``'s trash; False (nothing moved) if it cannot be renamed there."""
    trash = root / NAME
    for _attempt in (1, 2):  # a sweeper removes the trash once empty: made again then
        with contextlib.suppress(FileExistsError):
            os.mkdir(trash, 0o700)
        try:
            os.rename(volume, trash / f"{volume.parent.name}-{volume.name}-{os.urandom(4).hex()}")
            return True
        except FileNotFoundError:
            continue
        except OSError:
            return False
    return False


def pending(root: Path) -> bool:
    """Whether the trash holds anything and no sweeper is at work on it."""
    try:
        fd = os.open(root / NAME, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a sweeper holds it: it lists the trash again before it exits
        return bool(os.listdir(fd))
    finally:
        os.close(fd)


def sweep_later(root: Path) -> None:
    """Start a detached sweeper of ``root``'s trash (not waited for; it outlives this process).
    Run it as whoever may remove the layers' files (rootless: through mapped.call)."""
    subprocess.run(["sh", "-c", '"$@" </dev/null >/dev/null 2>&1 &', "sh", sys.executable, "-I", "-S", "-c", _SWEEPER],
                   cwd=root / NAME, check=False, start_new_session=True)
