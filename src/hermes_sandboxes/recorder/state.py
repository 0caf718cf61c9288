"""The host's own state: the journals and the audit log of every backend, in one directory.

A sandbox's history belongs to the host that drove it, not to the backend it lives on: the same
directory keeps the story of local, Sprites and E2B sandboxes, so the CLI can show the log of a
sandbox that a Hermes session created, on any backend. Layout, keyed by ``Backend.key`` (a stable
id of where a backend's sandboxes live, so two local stores or two Sprites accounts never mix)::

    <state>/<backend key>/audit.jsonl               every event of that backend's sandboxes
    <state>/<backend key>/journals/<sandbox>.jsonl  one sandbox's checkpoint journal
    <state>/leases/<digest>.*                       Hermes's writer leases (hermes/sync/leases.py)

``<state>`` is ``$HERMES_SANDBOXES_STATE``, else ``$XDG_STATE_HOME/hermes-sandboxes``, else
``~/.local/state/hermes-sandboxes``. ``recorded()`` is the one place a ``RecordedSandbox`` is built
(CLI, Hermes adapter, demo), so every face journals the same way; what a face adds (its agent
framework's hooks: the Hermes ones note a restore for running Hermes sessions) it passes in.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from hermes_sandboxes.errors import InvalidInput, SandboxError
from hermes_sandboxes.names import validate_name
from hermes_sandboxes.recorder.journal import Journal, RedactFn
from hermes_sandboxes.util import ownership

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from typing import Any

    from hermes_sandboxes.recorder.sandbox import RecordedSandbox
    from hermes_sandboxes.sandbox import Backend, Sandbox

STATE_ENV = "HERMES_SANDBOXES_STATE"
_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")


def default_state_dir() -> Path:
    explicit = os.environ.get(STATE_ENV)
    if explicit:
        return Path(explicit).absolute()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return base / "hermes-sandboxes"


def _backend_key(key: str) -> str:
    if not _KEY_RE.match(key):
        raise InvalidInput(f"backend key {key!r} cannot name a directory")
    return key


class HostState:
    """Journals and audit logs under ``root`` (default: ``default_state_dir()``)."""

    def __init__(self, root: str | os.PathLike[str] | None = None, *, durable: bool = True) -> None:
        self.root = Path(root).absolute() if root is not None else default_state_dir()
        self.durable = durable
        self._trusted = False

    def backend_dir(self, backend_key: str) -> Path:
        return self.root / _backend_key(backend_key)

    def journal_path(self, backend_key: str, sandbox: str) -> Path:
        return self.backend_dir(backend_key) / "journals" / f"{validate_name(sandbox)}.jsonl"

    def audit_path(self, backend_key: str) -> Path:
        return self.backend_dir(backend_key) / "audit.jsonl"

    def trusted(self) -> Path:
        """The state directory, made if missing; SandboxError if someone else could control it
        (util/ownership.py): the journals and audit logs in it are written as this user, root too."""
        if not self._trusted:
            try:
                ownership.ensure_dir(self.root, "the host state directory")
            except (ownership.Untrusted, OSError) as exc:
                raise SandboxError(f"{exc}; set {STATE_ENV} to a directory of your own") from None
            self._trusted = True
        return self.root

    def journal(self, backend: Backend, sandbox: str, redact: RedactFn | None = None) -> Journal:
        self.trusted()
        return Journal(self.journal_path(backend.key, sandbox), durable=self.durable, redact=redact)

    def audit(self, backend: Backend, redact: RedactFn | None = None) -> Journal:
        self.trusted()
        return Journal(self.audit_path(backend.key), durable=self.durable, redact=redact)

    def recorded(self, sandbox: Sandbox, *, redact: RedactFn | None = None, audit: Journal | None = None,
                 **options: Any) -> RecordedSandbox:
        """``sandbox`` with its journal and its backend's audit log; ``options`` go to
        ``RecordedSandbox`` (checkpointing, retention, health, credentials, hooks, origin).
        ``audit`` shares one open log between many sandboxes of a process."""
        from hermes_sandboxes.recorder.sandbox import RecordedSandbox

        backend = sandbox.backend
        return RecordedSandbox(sandbox, self.journal(backend, sandbox.name, redact),
                               audit if audit is not None else self.audit(backend, redact), **options)
