"""An append-only JSON-lines event log: each sandbox's checkpoint journal and the global audit log.

One class serves both; only the path differs (see ``hermes_sandboxes.recorder.state.HostState``).

Durability and concurrency, the guarantees the rest of the package relies on:

- Every append is a single ``write()`` of one complete line on an ``O_APPEND`` descriptor, under
  ``flock(LOCK_EX)``, followed by ``fdatasync`` unless the journal was opened with ``durable=False``.
  Two processes (or threads) never interleave their lines.
- A writer that dies mid-line leaves a torn line with no newline. The next writer sees that the file
  does not end with a newline and terminates it first, so the torn bytes stay on a line of their own.
- Readers take no lock: every line a writer finishes ends with the newline it wrote last, so a reader
  racing a writer sees at worst an unterminated tail, which it skips. Torn or invalid lines are
  skipped, never raised on; a missing file reads as empty.
- Strings are passed through the ``redact`` callable before they reach the disk, even though callers
  redact already: the log outlives the process, so it gets a second line of defence.

The records themselves (one type per event, and how a line is read back) are in ``records.py``;
their names can still be imported from here.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from hermes_sandboxes.errors import SandboxError
from hermes_sandboxes.recorder import records as _records
from hermes_sandboxes.recorder.records import (
    DELETE_REASONS,
    MAX_OUTPUT_TAIL_CHARS,
    SCHEMA_VERSION,
    TRIGGERS,
    AbandonedRecord,
    AllowRecord,
    CheckpointDeleteRecord,
    CheckpointNamedRecord,
    CheckpointRecord,
    CheckpointStartRecord,
    CreateRecord,
    DestroyRecord,
    EgressRecord,
    ExecRecord,
    ExecStartRecord,
    ForkRecord,
    HealthCheck,
    Intent,
    Record,
    RecordBase,
    RestoreRecord,
    RestoreStartRecord,
    StopRecord,
    command_text,
    parse_record,
    validate_trigger,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from typing import Any, TypeVar

    from hermes_sandboxes.recorder.records import DeleteReason as DeleteReason
    from hermes_sandboxes.recorder.records import Trigger as Trigger
    from hermes_sandboxes.recorder.story import Story

    R = TypeVar("R", bound=RecordBase)

RedactFn = Callable[[str], str]

# what callers import from here: the journal, and the records it keeps (which live in records.py)
__all__ = [
    "DELETE_REASONS", "MAX_FIELD_CHARS", "MAX_OUTPUT_TAIL_CHARS", "SCHEMA_VERSION", "TRIGGERS",
    "AbandonedRecord", "AllowRecord", "CheckpointDeleteRecord", "CheckpointNamedRecord", "CheckpointRecord",
    "CheckpointStartRecord", "CreateRecord", "DestroyRecord", "EgressRecord", "ExecRecord",
    "ExecStartRecord", "ForkRecord", "HealthCheck", "Intent", "Journal", "Record", "RecordBase", "RedactFn",
    "RestoreRecord", "RestoreStartRecord", "StopRecord", "command_text", "parse_record", "utf8_safe",
    "validate_trigger",
]

# Keeps one line well under a page-sized write and the journal readable when an agent sends a
# megabyte heredoc; the head of a command says what it was.
MAX_FIELD_CHARS = 8192
_TRUNCATION_MARK = "…[truncated {} chars]"
# Fields whose values we generate (or validate) ourselves; redacting them could only corrupt the
# structure of the log, never hide a secret.
_STRUCTURAL_FIELDS = frozenset({"v", "ts", "type", "sandbox", "id", "trigger", "reason", "owner", "intent"})


def __getattr__(name: str) -> object:
    """The type aliases ``Trigger`` and ``DeleteReason`` (see ``records``), made when first asked for."""
    return _records.__getattr__(name)


def _scrub_record(data: Mapping[str, Any], redact: RedactFn) -> dict[str, Any]:
    """Redact and clip every string in a record's dict, keeping its structural fields as they are."""
    return {k: v if k in _STRUCTURAL_FIELDS else _scrub(v, redact) for k, v in data.items()}


def utf8_safe(text: str) -> str:
    """``text`` as valid UTF-8: bytes that were not (Python keeps them as surrogate escapes in
    argv, file names and decoded output) become ``\\xNN``, so the record says what they were."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that escapes no byte
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


# Values that hold no string, told by their exact type before any check against the Mapping ABC:
# the first such check of a type in a process walks the ABC's registry and subclasses (~15 us
# each, ~1 ms per record written by a warm exec's worker, a fresh fork every call).
_PLAIN = frozenset({int, float, bool, type(None)})


def _scrub(value: Any, redact: RedactFn) -> Any:
    if isinstance(value, str):
        value = utf8_safe(redact(value))
        if len(value) > MAX_FIELD_CHARS:
            dropped = len(value) - MAX_FIELD_CHARS
            value = value[:MAX_FIELD_CHARS] + _TRUNCATION_MARK.format(dropped)
        return value
    if type(value) in _PLAIN:
        return value
    if isinstance(value, list | tuple):  # (never a Mapping: looked at first, for the same reason)
        return [_scrub(v, redact) for v in value]
    if isinstance(value, dict | Mapping):
        return {k: _scrub(v, redact) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------------------------------
# The file.


def _no_redaction(text: str) -> str:
    return text


class Journal:
    """An append-only JSON-lines log at ``path`` (created with its directory on first append)."""

    def __init__(self, path: Path, *, durable: bool = True, redact: RedactFn | None = None) -> None:
        self._path = Path(path)
        self._durable = durable
        self._redact = redact or _no_redaction
        # flock does not exclude threads sharing one descriptor, so threads also take this lock.
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._fd_pid = 0

    @property
    def path(self) -> Path:
        return self._path

    @property
    def durable(self) -> bool:
        return self._durable

    def close(self) -> None:
        with self._lock:
            if self._fd is not None and self._fd_pid == os.getpid():
                os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing --------------------------------------------------------------------------------

    def append(self, record: R) -> R:
        """Write one record durably; returns it as stored (redacted, clipped)."""
        data = _scrub_record(record.to_dict(), self._redact)
        line = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        self._write_line(line.encode("utf-8") + b"\n")
        stored = parse_record(data)
        assert isinstance(stored, type(record))
        return stored

    def _write_line(self, line: bytes) -> None:
        with self._lock:
            fd = self._writable_fd()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    line = b"\n" + line  # isolate the torn line a dead writer left behind
                view = memoryview(line)
                while view:  # a regular file takes it in one go; loop only for a short write
                    view = view[os.write(fd, view):]
                if self._durable:
                    _datasync(fd)
            except OSError as exc:
                raise SandboxError(
                    f"cannot append to journal {self._path}: {exc.strerror or exc}; "
                    "check that its directory is writable and the disk is not full"
                ) from exc
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _writable_fd(self) -> int:
        """The open descriptor, reopened after a fork (a shared descriptor shares its flock) or when
        the path no longer names the file we hold (deleted or replaced)."""
        if self._fd is not None and self._fd_pid == os.getpid():
            try:
                if os.stat(self._path).st_ino == os.fstat(self._fd).st_ino:
                    return self._fd
            except FileNotFoundError:
                pass
            os.close(self._fd)
        self._fd = None
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC
            try:
                fd = os.open(self._path, flags | os.O_CREAT | os.O_EXCL, 0o600)
                if self._durable:  # make the new directory entry itself survive a crash
                    _sync_dir(self._path.parent)
            except FileExistsError:
                fd = os.open(self._path, flags)
        except OSError as exc:
            raise SandboxError(
                f"cannot open journal {self._path}: {exc.strerror or exc}; check the directory's permissions"
            ) from exc
        self._fd, self._fd_pid = fd, os.getpid()
        return fd

    # -- reading --------------------------------------------------------------------------------

    def raw(self) -> Iterator[dict[str, Any]]:
        """Every complete line that decodes to a JSON object, in file order."""
        try:
            f = open(self._path, "rb")  # noqa: SIM115 - closed below; FileNotFoundError is the common case
        except FileNotFoundError:
            return
        except OSError as exc:
            raise SandboxError(f"cannot read journal {self._path}: {exc.strerror or exc}") from exc
        with f:
            for line in f:
                if not line.endswith(b"\n"):
                    return  # a writer is mid-line or died there
                try:
                    data = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                if isinstance(data, dict):
                    yield data

    def records(self, *, sandbox: str | None = None) -> list[Record]:
        """Typed records, oldest first, optionally only one sandbox's."""
        out: list[Record] = []
        for data in self.raw():
            record = parse_record(data)
            if record is not None and (sandbox is None or record.sandbox == sandbox):
                out.append(record)
        return out

    def records_of(self, kind: type[R], *, sandbox: str | None = None) -> list[R]:
        return [r for r in self.records(sandbox=sandbox) if isinstance(r, kind)]

    def story(self, sandbox: str | None = None, *, include_internal: bool = False) -> Story:
        from hermes_sandboxes.recorder.story import fold_story  # the story module reads records of this one

        return fold_story(self.records(sandbox=sandbox), include_internal=include_internal)

    def commands_since(self, checkpoint_id: str, *, sandbox: str | None = None,
                       created_at: float | None = None) -> list[ExecRecord] | None:
        return self.story(sandbox).commands_since(checkpoint_id, created_at=created_at)


def _datasync(fd: int) -> None:
    # fdatasync suffices for an append (it flushes the size); macOS only has fsync.
    sync = getattr(os, "fdatasync", os.fsync)
    sync(fd)


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
