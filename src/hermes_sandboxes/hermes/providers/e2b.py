"""The Hermes plugin ``e2b``: the E2B backend (``terminal.backend: e2b``), same plugin id and settings
keys as the existing E2B plugin.

Each profile is its own identity: the backend is built with the active profile's home key (Hermes's
``hermes_home_key()``, as the existing plugin reads it; it goes into every sandbox's identity digest
and owner tag) and the profile's ``E2B_API_KEY``, read from the profile and failing closed under a
multi-profile gateway; the key never leaves the host. Sandboxes are stamped and found by the existing
plugin's ``hermes_scope`` for Hermes's task id (not our sandbox name), so a user who switches plugins
finds the sandboxes the other one made.
"""

from __future__ import annotations

import hashlib
import importlib
from dataclasses import replace

from hermes_sandboxes import backends
from hermes_sandboxes.hermes.config import active_hermes_home
from hermes_sandboxes.hermes.providers.base import SandboxProvider
from hermes_sandboxes.hermes.secrets import hermes_profile_secret
from hermes_sandboxes.sandbox import Backend, Sandbox, SandboxSpec
from hermes_sandboxes.settings import BackendSettings

API_KEY = "E2B_API_KEY"


class E2BProvider(SandboxProvider):
    plugin_id = "e2b"
    uses_writer_lease = True
    backend_name = "e2b"
    label = "E2B"
    summary = "Run commands in an E2B cloud sandbox (paused between uses, snapshots as checkpoints)."
    environment_text = "an E2B cloud sandbox (a Linux VM; its filesystem persists while paused)"
    home_dir = "/home/user"
    setup_text = (
        "Install the SDK in Hermes's Python: pip install -e '/path/to/checkout[hermes,e2b]'.",
        "Put E2B_API_KEY=... in the profile's .env; E2B_API_URL, E2B_SANDBOX_URL and E2B_DOMAIN are honoured.",
        "Optional settings: template, cwd, lease_seconds (or idle_timeout, which is the lease), command_grace_seconds, "
        "allow_internet_access, "
        "allow (an egress allow-list), secure, metadata, auto_checkpoint, retention, credentials.",
    )

    def build_context(self) -> backends.BuildContext:
        """The shared context, and the active profile as the existing plugin names it (``home_key``)."""
        return replace(super().build_context(), profile=home_key())

    # The E2B backend's open and create take the Hermes task (its hermes_scope); the backend comes
    # from the registry, so it is called through the contract's names (no import of its module).
    def open_for_task(self, backend: Backend, name: str, spec: SandboxSpec | None, task_key: str) -> Sandbox:
        opened: Sandbox = backend.open(name, spec, task=task_key)  # type: ignore[call-arg]
        return opened

    def create_ephemeral(self, backend: Backend, name: str, spec: SandboxSpec, task_key: str) -> Sandbox:
        made: Sandbox = backend.create(name, spec, ephemeral=True, task=task_key)  # type: ignore[call-arg]
        return made

    def working_directory(self, cwd: str, settings: BackendSettings, sandbox: Sandbox) -> str:
        """The ``cwd`` setting (default the sandbox's home) where Hermes gives its container default."""
        configured = str(getattr(settings, "cwd", "") or sandbox.home)
        return configured if not cwd or cwd in ("~", "/root") else cwd

    def backend_identity(self, settings: BackendSettings) -> str:
        key = hermes_profile_secret(API_KEY) or ""
        return hashlib.sha256(f"{home_key()}\0{key}".encode()).hexdigest()  # never the key itself


def home_key() -> str:
    """The active profile as the existing E2B plugin names it in its digest: Hermes's
    ``hermes_home_key()`` (the resolved, case-normalised home), else the resolved home."""
    constants = importlib.import_module("hermes_constants")
    key = getattr(constants, "hermes_home_key", None)
    return str(key()) if callable(key) else str(active_hermes_home().resolve())
