"""The Hermes terminal-backend provider for the local sandbox (``terminal.backend: sandbox``).

Flags, each chosen on purpose (Hermes reads them through ``provider_flag``):

* ``is_remote = True``: commands do not run in the host's filesystem view (``/root``, ``/home`` and
  HERMES_HOME are masked, writes land in a copy-on-write layer), so Hermes must not describe the
  host's home and cwd to the model as where commands run.
* ``is_container = True``: the sandbox has its own root, so Hermes's file tools resolve paths inside
  it (through our environment) and host-looking cwds are replaced by the sandbox's.
* ``skip_container_guards = False``: the sandbox shares the host kernel and reads the host's root
  (outside the masks), and with ``network: host`` reaches host services; that is not disposable
  enough to waive Hermes's dangerous-command approval. Checkpoints make damage undoable, they do not
  make it impossible.
* ``cache_path_base = "/root/.hermes"``: where file sync puts ``~/.hermes`` (caches included).
* ``strip_env_keys``: the cloud backends' tokens plus every secret named in ``credentials``, so no
  host subprocess Hermes starts can read them; only the one command that needs a secret gets it.
* ``session_isolated_when_nonpersistent = True``: with ``container_persistent: false`` each session
  gets its own run-unique sandbox (delegate children follow their parent), never a shared one that
  two runs could destroy under each other.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

from agent.terminal_env_provider import TerminalEnvironmentProvider  # type: ignore[import-untyped]
from tools.environments.base import EnvironmentConnectionError  # type: ignore[import-untyped]

from hermes_sandboxes.errors import BackendUnavailable, SandboxNotFound
from hermes_sandboxes.journal import Journal, audit_path, journal_path
from hermes_sandboxes.recorder import RecordedSandbox
from hermes_sandboxes.sandbox import Backend, Sandbox, SandboxSpec
from hermes_sandboxes.secrets import CLOUD_SECRET_KEYS, Redactor, hermes_profile_secret
from hermes_sandboxes.settings import InvalidSettings, LocalSettings

from . import naming
from .config import load_settings, settings_path
from .environment import HERMES_DIR, EnvironmentOptions, SandboxEnvironment
from .runtime import RUNTIME

logger = logging.getLogger(__name__)

PLUGIN_ID = "sandbox"


def terminal_persistent() -> bool:
    """``terminal.container_persistent`` as Hermes resolved it for this profile (default true)."""
    try:
        from tools.terminal_scope import terminal_env  # type: ignore[import-untyped]

        raw = str(terminal_env("TERMINAL_CONTAINER_PERSISTENT", "true"))
    except Exception:
        raw = os.environ.get("TERMINAL_CONTAINER_PERSISTENT", "true")
    return raw.strip().lower() not in ("false", "0", "no", "off")


class LocalSandboxProvider(TerminalEnvironmentProvider):  # type: ignore[misc]
    is_remote = True
    is_container = True
    session_isolated_when_nonpersistent = True

    @property
    def name(self) -> str:
        return PLUGIN_ID

    @property
    def display_name(self) -> str:
        return "Local sandbox"

    @property
    def description(self) -> str:
        return "Run commands in a local copy-on-write sandbox with checkpoint and restore."

    @property
    def env_description(self) -> str:
        return "a local Linux sandbox (copy-on-write view of this machine, with checkpoints)"

    @property
    def skip_container_guards(self) -> bool:
        return False

    @property
    def cache_path_base(self) -> str:
        return HERMES_DIR

    @property
    def strip_env_keys(self) -> frozenset[str]:
        keys = set(CLOUD_SECRET_KEYS)
        with contextlib.suppress(Exception):  # a bad config must not break Hermes's subprocess spawns
            keys.update(self.settings().credentials.values())
        return frozenset(keys)

    # --- settings and availability ------------------------------------------------------------
    def settings(self) -> LocalSettings:
        return load_settings(LocalSettings, PLUGIN_ID)

    def unavailable_reason(self) -> str | None:
        """Why this machine cannot run local sandboxes, cheaply (no store access), or None."""
        if not sys.platform.startswith("linux"):
            return f"needs Linux (this is {sys.platform})"
        from hermes_sandboxes.backends.local import LocalBackend

        return LocalBackend.unavailable_reason()

    def is_available(self) -> bool:
        return self.unavailable_reason() is None

    def check_requirements(self, config: dict[str, Any]) -> bool:
        reason = self.unavailable_reason()
        if reason is not None:
            logger.error("terminal backend 'sandbox' cannot run here: %s", reason)
            return False
        try:
            self.settings()
        except InvalidSettings as exc:
            # Keep the terminal tool visible: its first command then fails with this exact reason,
            # which the model and the user see, instead of the tool silently disappearing.
            logger.error("terminal backend 'sandbox' refuses to start: %s", exc)
        return True

    def probe(self) -> tuple[str, str]:
        try:
            reason = self.unavailable_reason()
            if reason is not None:
                return ("unavailable", reason)
            self.settings()
            return ("ready", "")
        except InvalidSettings as exc:
            return ("needs_setup", str(exc))
        except Exception as exc:
            return ("unavailable", f"{type(exc).__name__}: {exc}")

    def setup_instructions(self) -> list[str]:
        where = settings_path(PLUGIN_ID)
        return [
            "The local sandbox needs Linux, root and btrfs-progs; sandboxes live under "
            "$HERMES_SANDBOXES_HOME (default /var/lib/hermes-sandboxes).",
            "Make sure config.yaml lists the plugin: plugins.enabled: [sandbox].",
            f"Optional settings go under {where}: name_prefix, scope (session|instance), "
            "network (none|loopback|host), memory (e.g. 2G), pids, cpus, base, masks, "
            "auto_checkpoint (off|risky|always), retention, credentials (program: SECRET_NAME).",
            "Commands have no network by default; set network: host to allow package installs.",
        ]

    def doctor_checks(self) -> list[tuple[bool, str, str]]:
        from .doctor import doctor_rows

        return doctor_rows(self)

    # --- environments ---------------------------------------------------------------------------
    def backend(self, settings: LocalSettings) -> Backend:
        reason = self.unavailable_reason()
        if reason is not None:
            raise BackendUnavailable(f"the local sandbox backend cannot run here: {reason}")
        return RUNTIME.local_backend(settings.store_home())

    def create_environment(
        self, *, cwd: str, timeout: int, task_id: str = "default", image: str | None = None,
        container_config: dict[str, Any] | None = None, **kwargs: Any,
    ) -> SandboxEnvironment:
        settings = self.settings()  # InvalidSettings: refuse, the message names the key
        profile = naming.resolve_profile()  # ProfileUnresolved: refuse, never borrow the default's
        cc = container_config or {}
        persistent = bool(cc.get("container_persistent", terminal_persistent()))
        try:
            backend = self.backend(settings)
        except BackendUnavailable as exc:
            raise EnvironmentConnectionError(str(exc)) from exc
        task_key = str(task_id or "default")
        redactor = Redactor()
        home = Path(getattr(backend, "home", settings.store_home()))
        audit = Journal(audit_path(home), redact=redactor.redact)

        def record(sandbox: Sandbox, created: bool) -> RecordedSandbox:
            recorded = RecordedSandbox(
                sandbox, Journal(journal_path(home, sandbox.name), redact=redactor.redact), audit,
                policy=settings.auto_checkpoint, retention=settings.retention,
                min_age=settings.retention_min_age,
                protected_paths=settings.protected_paths, health_command=settings.health_command,
            )
            if created:
                recorded.record_create()
            return recorded

        prefix, spec = settings.name_prefix, settings.spec()
        reopen = None
        if persistent:
            key = naming.task_key_for_scope(task_key, settings.scope)
            name = naming.require_within_prefix(prefix, naming.persistent_name(prefix, profile, key))
            recorded = record(*_open(backend, name, spec))

            def reopen() -> RecordedSandbox:
                return record(*_open(backend, name, spec))
        else:
            name = naming.require_within_prefix(prefix, naming.ephemeral_name(prefix, profile, task_key))
            recorded = record(backend.create(name, spec, ephemeral=True), True)
        options = EnvironmentOptions(
            task_key=task_key, persistent=persistent, credentials=dict(settings.credentials),
            lookup=hermes_profile_secret, sync_lock=RUNTIME.sync_lock(backend, name), redactor=redactor,
            reopen=reopen,
        )
        try:
            return SandboxEnvironment(recorded, cwd=cwd or "/root", timeout=timeout, options=options)
        except BaseException:
            if not persistent:
                recorded.destroy()
            raise


def _open(backend: Backend, name: str, spec: SandboxSpec) -> tuple[Sandbox, bool]:
    """Resume ``name`` or create it; the flag says whether it was created (a new story begins)."""
    try:
        return backend.get(name), False
    except SandboxNotFound:
        return backend.open(name, spec), True
