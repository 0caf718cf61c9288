"""Telling Hermes sessions that a sandbox's files went back in time: the recorder's hooks for Hermes.

A restore (by the CLI, the Python API or another session) leaves every running Hermes session with a
``~/.hermes`` in the sandbox that is the checkpoint's, not its own: each must bring it up to date
before its next command. ``hooks()`` gives a ``RecordedSandbox`` what it needs for that, and what
else a recorder of a sandbox Hermes may use must know about Hermes:

- ``on_restored``: a new token in the scope's writer lease (``leases.py``: its writer re-syncs,
  readers wait; with no holder the stamp is removed again at once, the next writer pushes all
  anyway) and the same token beside the sandbox's journal (``noted()``: what sessions without a
  writer lease read);
- ``on_destroyed``: the lease's files go with the sandbox, unless a Hermes process holds them;
- ``internal`` and ``scratch``: the commands Hermes sends by itself and its scratch files
  (``risk.internal``), recorded as internal and left out of previews.

Every face that can restore a sandbox Hermes uses passes these hooks (the Hermes plugin, the CLI).
This module stays light: the lease code is imported only when a restore or destroy happens.
"""

from __future__ import annotations

import os
from pathlib import Path

from hermes_sandboxes.errors import SandboxError
from hermes_sandboxes.recorder.options import Hooks
from hermes_sandboxes.risk.internal import hermes_internal, is_hermes_scratch

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from hermes_sandboxes.hermes.sync.leases import WriterLease
    from hermes_sandboxes.recorder.sandbox import RecordedSandbox


def writer_lease(state_root: Path, backend_key: str, sandbox: str) -> WriterLease:
    """One view of the writer lease of ``sandbox`` (see leases.py), under ``<state>/leases``."""
    from hermes_sandboxes.hermes.sync.leases import WriterLease

    return WriterLease(state_root / "leases", f"{backend_key}/{sandbox}", label=sandbox)


def note_path(journal: Path) -> Path:
    """The file beside a sandbox's journal that holds the token of its last restore."""
    return journal.with_name(journal.name + ".restored")


def noted(journal: Path) -> str:
    """The token of the last restore of the sandbox whose journal is ``journal`` ("" if none)."""
    try:
        return note_path(journal).read_text()
    except FileNotFoundError:
        return ""


def hooks(state_root: Path) -> Hooks:
    """The recorder hooks of a sandbox Hermes may use, its leases under ``state_root``."""

    def on_restored(recorded: RecordedSandbox) -> str:
        try:
            lease = writer_lease(state_root, recorded.inner.backend.key, recorded.name)
            token = lease.note_restored()
            _write_token(note_path(recorded.journal.path), token)
            lease.discard()
        except OSError as exc:
            raise SandboxError(f"sandbox {recorded.name} was restored, but running Hermes sessions could not be "
                               f"told ({exc}); their next command may see stale ~/.hermes files: restart them") from exc
        return token

    def on_destroyed(recorded: RecordedSandbox) -> None:
        writer_lease(state_root, recorded.inner.backend.key, recorded.name).discard()

    return Hooks(internal=hermes_internal, scratch=is_hermes_scratch, on_restored=on_restored,
                 on_destroyed=on_destroyed)


def _write_token(path: Path, token: str) -> None:
    """``token`` as ``path``'s whole content, replaced in one rename (a reader never sees half)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    temp.write_text(token)
    os.replace(temp, path)
