"""Host-side writer leases for remote sandboxes: who may sync state into a sandbox scope.

Several host processes (Hermes sessions, gateway workers) may run commands in the same remote sandbox.
Pushing ``~/.hermes`` from each of them at once would interleave writes, so per scope:

* **one writer**: the process holding an exclusive ``flock`` on ``<dir>/<scope>.lock`` runs state sync.
  The lock lives as long as the holder's open file, so a crashed writer releases it with its process.
* **readers** run commands without syncing, and try the lease again before each command: when the
  writer releases it, the next reader to ask takes over.
* **prepared stamp** (``<scope>.prepared``): the scope's initial push completed. A reader is admitted
  only once it exists (a reader must not run against a sandbox the writer is still filling).
* **dirty marker** (``<scope>.dirty``): a writer's per-command sync failed, so the sandbox may hold
  stale or half-written state. Readers are refused, with a retry hint, until a writer's sync succeeds
  and clears it.
* **restore stamp** (``<scope>.restored``): any process that restores the sandbox to a checkpoint
  writes a new token there (and marks the scope dirty: the sandbox's ``~/.hermes`` went back in time
  with everything else). The writer compares the token before each sync and, when it changed, brings
  the sandbox up to date again: only the files that differ, not a resend of everything.

Nothing is left behind: the writer removes the scope's files when it lets the lease go (the next
writer pushes everything anyway), the lock file last, while still holding it; a process that opened
the old lock file just before checks, once it has the lock, that the path still names that file,
and starts again on the new one when not. A crashed writer's files are removed by the next writer's
release, and ``discard()`` removes those of a sandbox that was destroyed, unless a writer holds them.

Where ``flock`` does not exist (or the filesystem refuses it), one warning is logged and every process
behaves as the single writer: sync still runs, the markers still gate admission.

``util.flock.exclusive(path)`` is the other lock: a short critical
section across processes (the egress allow-list's read-modify-write, so two changes at once both land).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import threading
from pathlib import Path
from typing import IO

from hermes_sandboxes.errors import SandboxError

try:
    import fcntl
except ImportError:  # not a POSIX platform
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

_warned = threading.Event()


class NotAdmitted(SandboxError):
    """This process may not run a command in the scope now (state not prepared, or marked dirty)."""


def _warn_no_flock(detail: str) -> None:
    if not _warned.is_set():
        _warned.set()
        logger.warning("writer leases: flock is not available here (%s); each process acts as the only "
                       "writer of its sandboxes, so do not share one sandbox between processes", detail)


def scope_file_stem(scope: str) -> str:
    """A file name for ``scope`` (any string: a backend key and a sandbox name)."""
    return hashlib.sha256(scope.encode()).hexdigest()[:32]


class WriterLease:
    """The writer lease, prepared stamp and dirty marker of one scope, as seen by one process."""

    def __init__(self, directory: str | os.PathLike[str], scope: str, *, label: str = "") -> None:
        self.directory = Path(directory)
        self.scope = scope
        self.label = label or scope  # for messages: the sandbox's name
        stem = scope_file_stem(scope)
        self._lock_path = self.directory / f"{stem}.lock"
        self.prepared_path = self.directory / f"{stem}.prepared"
        self.dirty_path = self.directory / f"{stem}.dirty"
        self.restored_path = self.directory / f"{stem}.restored"
        self._file: IO[bytes] | None = None
        self._single_writer = False  # no flock: this process acts as the writer
        self._mutex = threading.Lock()

    @property
    def is_writer(self) -> bool:
        return self._single_writer or self._file is not None

    def try_acquire(self) -> bool:
        """Become the scope's writer if nobody else is; True when this process is the writer."""
        with self._mutex:
            if self.is_writer:
                return True
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            while True:
                file = open(self._lock_path, "ab")  # noqa: SIM115 - held open as long as the lease
                if fcntl is None:
                    file.close()
                    _warn_no_flock("no fcntl module")
                    self._single_writer = True
                    return True
                try:
                    fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    file.close()
                    return False
                except OSError as exc:  # ENOLCK / EOPNOTSUPP: a filesystem without flock
                    file.close()
                    _warn_no_flock(str(exc))
                    self._single_writer = True
                    return True
                if _is_the_path(file, self._lock_path):
                    self._file = file
                    return True
                # The writer removed the file between our open and our lock: this lock guards
                # nothing any more. Lock the file the path names now (or create it afresh).
                file.close()

    def release(self) -> None:
        """Give the lease up (idempotent); a waiting reader takes over at its next command.

        The last holder of a lease leaves nothing behind: while it still holds the lock (so no other
        process can be the writer meanwhile) it removes the scope's markers, the prepared stamp
        first (a reader checking then is refused, never admitted to state nobody vouches for), and
        then the lock file itself; a process that opened the old file meanwhile notices when it
        gets the lock (see ``try_acquire``). The next writer starts from nothing and pushes all. In
        single-writer mode (no flock) nothing is removed: no lock makes that safe."""
        with self._mutex:
            self._single_writer = False
            file, self._file = self._file, None
        if file is None:
            return
        try:
            self._remove_files()
        finally:
            with contextlib.suppress(OSError):
                if fcntl is not None:
                    fcntl.flock(file.fileno(), fcntl.LOCK_UN)
            file.close()

    def _remove_files(self) -> None:
        """The scope's files, the lock last (the caller holds it). Markers are ``<stem>.<word>``."""
        stem = self._lock_path.stem
        markers = [p for p in self.directory.glob(f"{stem}.*")
                   if p != self._lock_path and "." not in p.name[len(stem) + 1:]]
        markers.sort(key=lambda p: p != self.prepared_path)
        for path in [*markers, self._lock_path]:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                logger.warning("writer lease of %s: could not remove %s: %s", self.label, path, exc)

    def discard(self) -> bool:
        """The scope's sandbox is gone: remove its lease files unless a writer holds them (True
        when removed, or nothing was there)."""
        try:
            if not self._lock_path.exists() and not any(self.directory.glob(f"{self._lock_path.stem}.*")):
                return True
            if not self.try_acquire():
                return False
        except OSError as exc:  # an unwritable state directory: nothing we can tidy
            logger.warning("writer lease of %s: could not remove its files: %s", self.label, exc)
            return False
        removed = not self._single_writer  # no flock: another process may be using them; leave them
        self.release()
        return removed

    # markers -----------------------------------------------------------------------------------
    @property
    def prepared(self) -> bool:
        return self.prepared_path.exists()

    @property
    def dirty(self) -> bool:
        return self.dirty_path.exists()

    def _require_writer(self, what: str) -> None:
        if not self.is_writer:
            raise RuntimeError(f"only the writer of {self.label} may {what}")

    def begin_prepare(self) -> None:
        """The writer starts an initial push: the scope is not prepared until ``mark_prepared``."""
        self._require_writer("prepare its state")
        with contextlib.suppress(FileNotFoundError):
            self.prepared_path.unlink()

    def mark_prepared(self) -> None:
        self._require_writer("mark it prepared")
        _touch(self.prepared_path)

    def mark_dirty(self) -> None:
        """A sync by the writer failed: refuse readers until a later sync succeeds."""
        self._require_writer("mark it dirty")
        _touch(self.dirty_path)

    def mark_clean(self) -> None:
        self._require_writer("clear its dirty marker")
        with contextlib.suppress(FileNotFoundError):
            self.dirty_path.unlink()

    def note_restored(self) -> str:
        """This process restored the sandbox to a checkpoint (any process may say so): readers are
        refused until the writer has synced again, and the writer's next sync sees a new token
        (returned)."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        _touch(self.dirty_path)
        token = secrets.token_hex(16)
        temp = self.restored_path.with_name(f"{self.restored_path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        temp.write_text(token)
        os.replace(temp, self.restored_path)
        return token

    def restore_token(self) -> str:
        """The token of the last restore of the scope's sandbox ("" if none was ever noted)."""
        try:
            return self.restored_path.read_text()
        except FileNotFoundError:
            return ""

    def admit(self) -> None:
        """May a reader run a command now? Raises NotAdmitted (with a retry hint) when not."""
        if self.is_writer:
            return
        if self.dirty:
            raise NotAdmitted(f"the state of sandbox {self.label} is marked dirty: the process syncing it "
                              "failed to bring it up to date, or has not yet since a checkpoint restore; "
                              "retry after that process syncs again or exits")
        if not self.prepared:
            raise NotAdmitted(f"sandbox {self.label} is still being prepared by another process; retry in "
                              "a moment")


def _is_the_path(file: IO[bytes], path: Path) -> bool:
    """Whether ``file`` is still what ``path`` names (not removed, not replaced)."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(file.fileno())
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(fd)
