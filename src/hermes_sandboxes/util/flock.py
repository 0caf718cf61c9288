"""Cross-process locks on files with ``flock``: a short critical section (``exclusive``) and the
polling wait both it and the writer leases use (``wait_for_flock``).

Where ``flock`` does not exist (no ``fcntl``, or a filesystem that refuses it), ``exclusive`` logs
one warning and runs the block unguarded: a lock that cannot exist must not stop the work it guards.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from hermes_sandboxes.errors import SandboxError

try:
    import fcntl
except ImportError:  # not a POSIX platform
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)
_warned = threading.Event()


def wait_for_flock(fd: int, timeout: float) -> bool:
    """Take the exclusive lock on ``fd``, polling until ``timeout``; False when it stayed taken.
    OSError when there is no ``flock`` here (no fcntl, or ENOLCK / EOPNOTSUPP)."""
    if fcntl is None:
        raise OSError("no fcntl module")
    deadline, pause = time.monotonic() + timeout, 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.05)


@contextlib.contextmanager
def exclusive(path: Path, *, what: str, timeout: float = 60.0) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created with its directory) for the block, waiting
    up to ``timeout`` seconds for another holder, process or thread (each open is its own lock),
    to let it go; SandboxError naming ``what`` when it does not. A holder that dies releases it
    with its process. The file stays (removing a lock file others may be waiting on would let two
    holders in); without flock, the block runs unguarded after one warning."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        locked = False
        try:
            locked = wait_for_flock(fd, timeout)
        except OSError as exc:  # no fcntl, or ENOLCK / EOPNOTSUPP: a filesystem without flock
            if not _warned.is_set():
                _warned.set()
                logger.warning("flock is not available here (%s); %s runs without a lock", exc, what)
        else:
            if not locked:
                raise SandboxError(f"{what}: another process has held the lock {path} for {timeout:.0f} s; "
                                   "retry when it is done")
        try:
            yield
        finally:
            if locked and fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
