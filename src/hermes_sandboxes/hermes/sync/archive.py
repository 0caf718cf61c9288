"""Archives a sandbox sends to the host: untrusted input, bounded while it streams.

Whatever runs in a sandbox can answer a request for its files with anything: an endless stream, a
tar whose members point outside the destination, devices, links. Two rules hold for every archive
the host takes from a sandbox (the teardown pull and recovery on resume):

* **capped mid-transfer**: ``capture`` counts bytes as they arrive and, at the cap (2 GiB unless the
  caller says otherwise; the Hermes plugin passes Hermes's ``terminal.sync_back_max_bytes``), stops
  storing them and kills the sandbox command, so an oversized archive never lands on the host's disk
  in full and the transfer does not run on until it ends by itself;
* **filtered member by member**: ``regular_files`` admits only regular files that pass the standard
  library's ``tarfile.data_filter`` (no absolute paths, no ``..``, nothing outside the destination),
  and reports the members it refused instead of failing the whole archive on one of them.
"""

from __future__ import annotations

import posixpath
import tarfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from hermes_sandboxes.errors import SandboxError, SandboxNotFound
from hermes_sandboxes.sandbox import Process, Sandbox

MAX_ARCHIVE_BYTES = 2 * 1024 ** 3  # what the host accepts from one sandbox archive
TRANSFER_TIMEOUT_S = 120.0


class StateUnreadable(SandboxError):
    """The sandbox's files could not be read back (lost connection, failing command, a corrupt or
    oversized archive). Callers fail closed: nothing was written on the host."""

    retryable = True


class ArchiveTooLarge(StateUnreadable):
    """The sandbox sent more than the cap; the transfer was cut off while it streamed."""


@dataclass
class _Capture:
    dest: BinaryIO
    limit: int
    received: int = 0
    over: bool = False
    proc: Process | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def write(self, chunk: bytes) -> None:
        with self.lock:
            if self.over:
                return
            if self.received + len(chunk) > self.limit:
                self.over = True  # keep nothing past the cap, and stop the sender now
                proc = self.proc
            else:
                self.dest.write(chunk)
                self.received += len(chunk)
                return
        if proc is not None:
            proc.kill()


def capture(sandbox: Sandbox, argv: Sequence[str], dest: BinaryIO, *, what: str,
            limit: int = MAX_ARCHIVE_BYTES, timeout: float = TRANSFER_TIMEOUT_S) -> tuple[int, str]:
    """Run ``argv`` in the sandbox with its stdout going to ``dest``, at most ``limit`` bytes.

    Returns the command's exit code and the tail of its stderr (for messages). Raises
    ArchiveTooLarge once the stream passes ``limit`` (the command is killed at that moment),
    SandboxNotFound when the sandbox is gone, and StateUnreadable when the command cannot run or
    does not end within ``timeout``."""
    sink = _Capture(dest, limit)
    errors = bytearray()

    def stderr(chunk: bytes) -> None:
        errors.extend(chunk)
        del errors[:-2000]

    try:
        proc = sandbox.start(list(argv), on_stdout=sink.write, on_stderr=stderr)
    except SandboxNotFound:
        raise  # the sandbox is gone: not a transfer that may work if tried again
    except SandboxError as exc:
        raise StateUnreadable(f"{what}: could not read files from sandbox {sandbox.name}: {exc}") from exc
    with sink.lock:
        sink.proc = proc
        over = sink.over
    if over:  # the cap was passed before start() returned
        proc.kill()
    try:
        code = proc.wait(timeout)
    except SandboxNotFound:
        raise
    except SandboxError as exc:
        raise StateUnreadable(f"{what}: reading files from sandbox {sandbox.name} failed: {exc}") from exc
    if sink.over:
        proc.wait(10)  # reap the killed sender; its code says nothing
        raise ArchiveTooLarge(f"{what}: sandbox {sandbox.name} sent more than {limit} bytes; the transfer "
                              "was cut off and nothing of it was used")
    if code is None:
        proc.kill()
        raise StateUnreadable(f"{what}: reading files from sandbox {sandbox.name} did not finish within "
                              f"{timeout:.0f} s")
    return code, errors.decode("utf-8", "replace").strip()


@dataclass(frozen=True)
class RefusedMember:
    """A member an archive held that the host did not take, and why."""

    name: str
    reason: str


def regular_files(tar: tarfile.TarFile, refused: list[RefusedMember]) -> Iterator[tuple[str, tarfile.TarInfo]]:
    """The archive's regular files as (normalised relative path, member), each checked by
    ``tarfile.data_filter``; unsafe ones are appended to ``refused`` and skipped. Links, devices and
    fifos are skipped without a word. Raises tarfile.TarError when the archive itself is corrupt."""
    for member in tar.getmembers():
        if not member.isreg():
            continue  # directories come with their files; links, devices and fifos are not taken
        if member.name.startswith("/"):  # the data filter would make it relative; refuse it outright
            refused.append(RefusedMember(member.name, "unsafe member: an absolute path"))
            continue
        try:
            filtered = tarfile.data_filter(member, "/nonexistent-destination")
        except tarfile.FilterError as exc:
            refused.append(RefusedMember(member.name, f"unsafe member: {exc}"))
            continue
        rel = posixpath.normpath(filtered.name)
        parts = rel.split("/")
        if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
            refused.append(RefusedMember(member.name, "unsafe member path"))
            continue
        yield rel, filtered


def complete(tar: tarfile.TarFile, size: int) -> bool:
    """Whether every member's data lies within the ``size`` bytes received (a cut archive is not)."""
    return all(m.offset_data + (m.size if m.isreg() else 0) <= size for m in tar.getmembers())


def keep_regular_files(source: BinaryIO, dest: BinaryIO, refused: list[RefusedMember],
                       unsafe: Callable[[str], str] = lambda rel: "") -> int:
    """Copy the acceptable regular files of archive ``source`` into a new archive ``dest`` (for a
    consumer that extracts a whole archive at once, where one bad member would fail all of it);
    ``unsafe(rel)`` may refuse more, by returning why. Returns how many were kept; raises
    tarfile.TarError when ``source`` is corrupt."""
    kept = 0
    with tarfile.open(fileobj=source, mode="r:") as tar, tarfile.open(fileobj=dest, mode="w") as out:
        for rel, member in regular_files(tar, refused):
            why = unsafe(rel)
            if why:
                refused.append(RefusedMember(rel, why))
                continue
            data = tar.extractfile(member)
            clean = tarfile.TarInfo(rel)
            clean.size, clean.mode, clean.mtime = member.size, member.mode, member.mtime
            out.addfile(clean, data)
            kept += 1
    return kept
