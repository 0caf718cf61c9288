"""Recovery on resume: take back what the agent wrote in a sandbox before the host's state covers it.

A persistent remote sandbox outlives the host process that used it. When that process never pulled
the agent's files back (a crash, a failed teardown pull, a kill), the next process to resume the
sandbox would push the host's ``~/.hermes`` over them and the agent's work would be gone. So before
that push, ``recover`` reads the recoverable trees (``skills/`` and ``memories/``) from the sandbox
and, file by file:

* a file the host lacks is **restored in place**;
* a file the host has with the same bytes needs nothing;
* a file the host has with other bytes is a **conflict** (nothing says which copy is newer): the host
  copy stays, the sandbox copy is **quarantined** under
  ``~/.hermes/cache/hermes-sandboxes-recovered/<sandbox>-<UTC time>/`` with its relative path, and a
  warning names it. So is a file whose host path is not a regular file or cannot be read, one that
  would land on a credential (host-only) path, and one whose way in passes a symlink (a symlinked
  ``skills/`` counts: in-place recovery writes only into the physical tree below the Hermes home);
* a file the host cannot hold at all (an ancestor that is a regular file, a name too long) stays in
  the sandbox and a warning names it: it costs that file, not the resume.

Every write goes through ``hostwrite`` (descriptor walks, no symlink followed, no replace, no partial
file). The archive is untrusted (``archive``: capped while it streams, members filtered by the tar
data filter; links, devices and unsafe names are skipped and named). When the sandbox's files cannot
be read, or the quarantine tree is not where it must be, recovery fails closed before writing
anything and raises: the caller must not push, since the push would bury the only copy. A sandbox
with no such trees at all has nothing to recover.

Not covered: a process still running in the sandbox may write a recoverable file after this snapshot
is taken; the push that follows overwrites a path the host also has (new paths survive: a push
deletes nothing it did not send).
"""

from __future__ import annotations

import logging
import os
import re
import stat
import tarfile
import tempfile
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from hermes_sandboxes.errors import SandboxError
from hermes_sandboxes.hermes.sync.archive import (
    MAX_ARCHIVE_BYTES,
    RefusedMember,
    StateUnreadable,
    capture,
    complete,
    regular_files,
)
from hermes_sandboxes.hermes.sync.hostwrite import Blocked, Redirected, Tree, create_file, same_content
from hermes_sandboxes.sandbox import Sandbox

logger = logging.getLogger(__name__)

RECOVERABLE_ROOTS = ("skills", "memories")
RECOVERED_DIR = ("cache", "hermes-sandboxes-recovered")
# host-only paths of a Hermes home, whatever the profile registers on top (never written from a sandbox)
HOST_ONLY = (".env", "auth.json", "config.yaml", "platforms")

# Reads the recoverable trees as one tar on stdout. No Hermes home, or none of the trees: no output,
# exit 0 (nothing to recover). Anything else (tar missing, unreadable files, files changing while
# read) is a non-zero exit and recovery fails closed.
_READ_SCRIPT = r"""
base=$1; shift
if [ ! -e "$base" ] && [ ! -L "$base" ]; then exit 0; fi
cd -- "$base" || exit 3
found=""
for root in "$@"; do
  if [ -e "$root" ] || [ -L "$root" ]; then found="$found $root"; fi
done
[ -n "$found" ] || exit 0
exec tar -cf - --exclude='*.sock' $found
"""


class RecoveryFailed(SandboxError):
    """Recovery could not place the sandbox's files safely on the host; nothing was pushed over them."""


@dataclass
class RecoveryReport:
    """What one recovery did, by relative path below the Hermes home."""

    sandbox: str
    restored: list[str] = field(default_factory=list)
    quarantined: list[tuple[str, str]] = field(default_factory=list)  # (path, why)
    left_in_sandbox: list[tuple[str, str]] = field(default_factory=list)  # (path, why)
    quarantine_dir: Path | None = None

    def log(self) -> None:
        if self.restored:
            logger.warning("sandbox %s: recovered %d file(s) the host did not have: %s", self.sandbox,
                           len(self.restored), ", ".join(self.restored))
        for path, why in self.quarantined:
            logger.warning("sandbox %s: its copy of %s was kept aside in %s (%s)", self.sandbox, path,
                           self.quarantine_dir, why)
        for path, why in self.left_in_sandbox:
            logger.warning("sandbox %s: %s was not recovered and stays only in the sandbox (%s)",
                           self.sandbox, path, why)


@dataclass(frozen=True)
class _Entry:
    rel: str
    offset: int
    size: int
    mode: int


def recover(sandbox: Sandbox, *, remote_base: str, host_home: str | os.PathLike[str],
            protected: Collection[str] = (), roots: Sequence[str] = RECOVERABLE_ROOTS,
            limit: int = MAX_ARCHIVE_BYTES) -> RecoveryReport:
    """Recover ``roots`` of ``remote_base`` (the sandbox's Hermes home) into ``host_home``.

    ``protected``: relative paths below ``host_home`` (files or directories) that only the host may
    write, on top of ``HOST_ONLY``. Raises StateUnreadable or RecoveryFailed (nothing written)."""
    report = RecoveryReport(sandbox.name)
    home = Path(os.path.realpath(host_home))  # a symlinked home is the home; links below it are not
    guard = _Guard(protected)
    with tempfile.TemporaryFile(prefix="hermes-sandboxes-recover-") as spool:
        code, err = capture(sandbox, ["sh", "-c", _READ_SCRIPT, "sh", remote_base, *roots], spool,
                            what="recovery on resume", limit=limit)
        if code != 0:
            raise StateUnreadable(f"recovery on resume: could not read {remote_base} in sandbox {sandbox.name} "
                                  f"(exit {code}: {err or 'no message'}); its files were not pushed over, "
                                  "retry when the sandbox is reachable")
        size = spool.tell()
        if size == 0:
            return report  # no Hermes state in the sandbox: nothing to recover
        entries, refused = _read_index(spool, size, sandbox.name, roots)
        report.left_in_sandbox += [(r.name, r.reason) for r in refused]
        with Tree(home) as tree:
            _apply(tree, entries, spool, guard, report)
    return report


def _read_index(spool: IO[bytes], size: int, name: str,
                roots: Sequence[str]) -> tuple[list[_Entry], list[RefusedMember]]:
    """The archive's acceptable regular files, validated in full before anything is written."""
    spool.seek(0)
    refused: list[RefusedMember] = []
    try:
        with tarfile.open(fileobj=spool, mode="r:") as tar:
            if not complete(tar, size):
                raise tarfile.ReadError("the archive ends inside a member")
            found = list(regular_files(tar, refused))
    except tarfile.TarError as exc:
        raise StateUnreadable(f"recovery on resume: the archive of sandbox {name} is unreadable ({exc}); "
                              "its files were not pushed over, retry") from exc
    entries = []
    for rel, member in found:
        if rel.split("/")[0] not in roots:
            refused.append(RefusedMember(rel, "outside the recoverable trees"))
        elif member.issparse():
            refused.append(RefusedMember(rel, "a sparse archive member"))
        else:
            entries.append(_Entry(rel, member.offset_data, member.size, member.mode))
    return entries, refused


class _Guard:
    """The host-only paths (credentials, config): never written from sandbox data."""

    def __init__(self, protected: Collection[str]) -> None:
        self.paths = {p.strip("/") for p in (*HOST_ONLY, *protected) if p.strip("/")}

    def covers(self, rel: str) -> bool:
        parts = rel.split("/")
        return any("/".join(parts[:i]) in self.paths for i in range(1, len(parts) + 1))


def _apply(tree: Tree, entries: list[_Entry], spool: IO[bytes], guard: _Guard, report: RecoveryReport) -> None:
    source = spool.fileno()
    plans = [(entry, _plan(tree, entry, source, guard)) for entry in entries]
    quarantine = _Quarantine(tree, report, guard)
    if any(action == "quarantine" for _, (action, _why) in plans):
        quarantine.open()  # a quarantine that cannot be placed fails closed before anything is written
    try:
        for entry, (action, why) in plans:
            if action == "restore":
                action, why = _restore(tree, entry, source)
                if action == "restored":
                    report.restored.append(entry.rel)
            if action == "quarantine":
                quarantine.keep(entry, source, why)
            elif action == "skip":
                report.left_in_sandbox.append((entry.rel, why))
    finally:
        quarantine.close()


def _plan(tree: Tree, entry: _Entry, source: int, guard: _Guard) -> tuple[str, str]:
    """What to do with one file, looking only (nothing is created here)."""
    if guard.covers(entry.rel):
        return "quarantine", "a host-only (credential) path: never written from sandbox data"
    *dirs, name = entry.rel.split("/")
    try:
        fd = tree.open_dir(dirs, create=False)
    except FileNotFoundError:
        return "restore", ""
    except Redirected:
        return "quarantine", "a symlink on its host path: in-place recovery never writes through links"
    except Blocked as exc:
        return "skip", f"the host cannot hold it: {exc.strerror}"
    try:
        return _compare(tree, fd, name, entry, source)
    finally:
        os.close(fd)


def _compare(tree: Tree, fd: int, name: str, entry: _Entry, source: int) -> tuple[str, str]:
    try:
        st = tree.lstat(fd, name)
    except OSError as exc:
        return "skip", f"the host cannot hold it: {exc.strerror}"
    if st is None:
        return "restore", ""
    if not stat.S_ISREG(st.st_mode):
        return "quarantine", "the host path is not a regular file"
    try:
        same = same_content(fd, name, source, entry.offset, entry.size)
    except OSError as exc:
        return "quarantine", f"the host copy cannot be read ({exc.strerror})"
    return ("same", "") if same else ("quarantine", "conflict: the host and the sandbox hold different versions")


def _restore(tree: Tree, entry: _Entry, source: int) -> tuple[str, str]:
    *dirs, name = entry.rel.split("/")
    try:
        fd = tree.open_dir(dirs, create=True)
    except Redirected:
        return "quarantine", "a symlink on its host path: in-place recovery never writes through links"
    except OSError as exc:
        return "skip", f"the host cannot hold it: {exc.strerror}"
    try:
        create_file(fd, name, source, entry.offset, entry.size, entry.mode | 0o600)
        return "restored", ""
    except FileExistsError:  # appeared since it was planned: decide again on what is there now
        return _compare(tree, fd, name, entry, source)
    except OSError as exc:
        return "skip", f"the host cannot hold it: {exc.strerror}"
    finally:
        os.close(fd)


class _Quarantine:
    """The per-recovery directory under ``RECOVERED_DIR``, made on first use. Its position is
    verified like everything else (no symlink from the home down to it), and a failure to place it
    or a file in it safely fails the whole recovery: the sandbox copy must not be lost."""

    def __init__(self, home: Tree, report: RecoveryReport, guard: _Guard) -> None:
        self._home, self._report, self._guard = home, report, guard
        self._tree: Tree | None = None
        self._name = ""

    def open(self) -> Tree:
        if self._tree is not None:
            return self._tree
        label = re.sub(r"[^A-Za-z0-9._-]+", "-", self._report.sandbox)[:80] or "sandbox"
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        try:
            parent = self._home.subtree(list(RECOVERED_DIR), create=True)
        except OSError as exc:
            raise RecoveryFailed(f"recovery on resume: {'/'.join(RECOVERED_DIR)} in {self._home.root} is "
                                 f"not a plain directory ({exc}); remove the link or fix it, then retry") from exc
        with parent:
            for n in range(1, 100):
                name = f"{label}-{stamp}" + (f"-{n}" if n > 1 else "")
                try:
                    os.mkdir(name, 0o700, dir_fd=parent.fd)
                except FileExistsError:
                    continue
                self._name = name
                self._tree = parent.subtree([name], create=False)
                self._report.quarantine_dir = self._home.root.joinpath(*RECOVERED_DIR, name)
                return self._tree
        raise RecoveryFailed(f"recovery on resume: no free directory name under {'/'.join(RECOVERED_DIR)}")

    def keep(self, entry: _Entry, source: int, why: str) -> None:
        tree = self.open()
        if self._guard.covers("/".join((*RECOVERED_DIR, self._name, entry.rel))):
            raise RecoveryFailed(f"recovery on resume: the place for {entry.rel} in the quarantine is a "
                                 "host-only path; nothing was written over it")
        *dirs, name = entry.rel.split("/")
        try:
            fd = tree.open_dir(dirs, create=True)
        except Redirected as exc:
            raise RecoveryFailed(f"recovery on resume: a symlink appeared in the quarantine ({exc})") from exc
        except OSError as exc:
            self._report.left_in_sandbox.append((entry.rel, f"it could not be kept aside: {exc.strerror}"))
            return
        try:
            create_file(fd, name, source, entry.offset, entry.size, entry.mode | 0o600)
        except OSError as exc:
            self._report.left_in_sandbox.append((entry.rel, f"it could not be kept aside: {exc.strerror}"))
            return
        finally:
            os.close(fd)
        self._report.quarantined.append((entry.rel, why))

    def close(self) -> None:
        if self._tree is not None:
            self._tree.close()
