"""What every one of our Hermes terminal-backend providers shares; a backend's plugin only declares.

A provider subclass names its plugin id (the ``terminal.backend`` value and the
``plugins.entries.<id>.settings`` key), the registry backend it drives, its texts and flags. All the
rest is here: settings (validated; a bad value is an error naming the key), availability, probe,
doctor rows, setup text, and ``create_environment``, which picks the task's sandbox by a
deterministic, profile-scoped name and wraps it in the recorder.

Flags, each chosen on purpose (Hermes reads them through ``provider_flag``):

* ``is_remote = True``: commands do not run in the host's filesystem view, so Hermes must not
  describe the host's home and cwd to the model as where commands run.
* ``is_container = True``: the sandbox has its own root, so Hermes's file tools resolve paths inside
  it (through our environment) and host-looking cwds are replaced by the sandbox's.
* ``skip_container_guards = False``: Hermes's dangerous-command approval stays on. Checkpoints make
  damage undoable, they do not make it impossible (and the local sandbox shares the host kernel).
* ``cache_path_base``: where file sync puts ``~/.hermes`` (the sandbox's home + ``/.hermes``).
* ``strip_env_keys``: the cloud backends' tokens plus every secret named in ``credentials``, so no
  host subprocess Hermes starts can read them; only the one command that needs a secret gets it.
* ``session_isolated_when_nonpersistent = True``: with ``container_persistent: false`` each session
  gets its own run-unique sandbox, never a shared one that two runs could destroy under each other.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any, ClassVar

from agent.terminal_env_provider import TerminalEnvironmentProvider
from tools.environments.base import EnvironmentConnectionError

from hermes_sandboxes import backends
from hermes_sandboxes.errors import BackendUnavailable, SandboxError, SpecMismatch
from hermes_sandboxes.hermes import allowlist, naming
from hermes_sandboxes.hermes.config import load_settings, settings_path
from hermes_sandboxes.hermes.environment import EnvironmentOptions, SandboxEnvironment
from hermes_sandboxes.hermes.runtime import RUNTIME
from hermes_sandboxes.hermes.secrets import hermes_profile_secret
from hermes_sandboxes.hermes.sync import restores
from hermes_sandboxes.recorder.credentials import CLOUD_SECRET_KEYS, Redactor
from hermes_sandboxes.recorder.options import Checkpointing, Credentials, Health, Retention
from hermes_sandboxes.recorder.sandbox import RecordedSandbox
from hermes_sandboxes.sandbox import Backend, Sandbox, SandboxSpec
from hermes_sandboxes.settings import BackendSettings, InvalidSettings

logger = logging.getLogger(__name__)

# The task id of Hermes's system-prompt probe (one ``uname`` in a fresh environment, then cleanup)
PROBE_TASK_ID = "prompt-backend-probe"


def terminal_persistent() -> bool:
    """``terminal.container_persistent`` as Hermes resolved it for this profile (default true)."""
    try:
        from tools.terminal_scope import terminal_env

        raw = str(terminal_env("TERMINAL_CONTAINER_PERSISTENT", "true"))
    except Exception:
        raw = os.environ.get("TERMINAL_CONTAINER_PERSISTENT", "true")
    return raw.strip().lower() not in ("false", "0", "no", "off")


def as_hermes_error(exc: SandboxError) -> Exception:
    """The one place our errors meet Hermes's: what may work if tried again (a lost connection, a
    rate limit, a backend that cannot run now) becomes Hermes's connection error, which it retries
    and reports as a degraded backend; everything else stays as it is."""
    if exc.retryable or isinstance(exc, BackendUnavailable):
        converted: Exception = EnvironmentConnectionError(str(exc))
        return converted
    return exc


class SandboxProvider(TerminalEnvironmentProvider):  # type: ignore[misc]
    """The shared provider. Subclasses set the class attributes below."""

    plugin_id: ClassVar[str]  # the terminal.backend value and the plugins.entries key
    backend_name: ClassVar[str]  # the registry name of the backend it drives
    label: ClassVar[str]  # e.g. "Local sandbox"
    summary: ClassVar[str]
    environment_text: ClassVar[str]
    setup_text: ClassVar[tuple[str, ...]] = ()
    home_dir: ClassVar[str] = "/root"  # the sandbox's home; ~/.hermes is synced below it
    settings_label: ClassVar[str] = ""  # the doctor row of the settings (default "<label> settings")

    is_remote = True
    uses_writer_lease: ClassVar[bool] = False  # remote services: one host process per scope syncs state
    is_container = True
    session_isolated_when_nonpersistent = True

    @property
    def name(self) -> str:
        return self.plugin_id

    @property
    def display_name(self) -> str:
        return self.label

    @property
    def description(self) -> str:
        return self.summary

    @property
    def env_description(self) -> str:
        return self.environment_text

    @property
    def skip_container_guards(self) -> bool:
        return False

    @property
    def cache_path_base(self) -> str:
        return f"{self.home_dir}/.hermes"

    @property
    def strip_env_keys(self) -> frozenset[str]:
        keys = set(CLOUD_SECRET_KEYS)
        with contextlib.suppress(Exception):  # a bad config must not break Hermes's subprocess spawns
            keys.update(self.settings().credentials.values())
        return frozenset(keys)

    # --- settings and availability ------------------------------------------------------------
    def settings(self) -> BackendSettings:
        return load_settings(backends.settings_model(self.backend_name), self.plugin_id)

    def unavailable_reason(self) -> str | None:
        """Why this machine cannot run this backend, cheaply (no network, no store), or None."""
        missing = backends.missing_dependency(self.backend_name)
        if missing is not None:
            return missing
        try:
            return self.backend(self.settings(), check=False).unavailable_reason()
        except InvalidSettings:
            return None  # reported as invalid settings, not as an unusable machine
        except SandboxError as exc:
            return str(exc)

    def is_available(self) -> bool:
        return self.unavailable_reason() is None

    def check_requirements(self, config: dict[str, Any]) -> bool:
        reason = self.unavailable_reason()
        if reason is not None:
            logger.error("terminal backend %r cannot run here: %s", self.plugin_id, reason)
            return False
        try:
            self.settings()
        except InvalidSettings as exc:
            # Keep the terminal tool visible: its first command then fails with this exact reason,
            # which the model and the user see, instead of the tool silently disappearing.
            logger.error("terminal backend %r refuses to start: %s", self.plugin_id, exc)
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
        return [*self.setup_text,
                f"Make sure config.yaml lists the plugin: plugins.enabled: [{self.plugin_id}].",
                f"Settings go under {settings_path(self.plugin_id)}; `hermes status --full` shows whether "
                "they are valid."]

    def doctor_checks(self) -> list[tuple[bool, str, str]]:
        from hermes_sandboxes.hermes.doctor import doctor_rows

        return doctor_rows(self)

    # --- environments ---------------------------------------------------------------------------
    # --- what a backend's plugin may override ------------------------------------------------
    def make_backend(self, settings: BackendSettings) -> Backend:
        """A new backend for these settings, built by the registry with ``build_context()``."""
        return backends.build(settings, self.backend_name, context=self.build_context())

    def build_context(self) -> backends.BuildContext:
        """What the registry's factory gets from Hermes: secrets (tokens, brokered credentials) read
        from the active profile (its secret scope, else, one profile per process, Hermes's
        environment and the profile's .env; nothing under a multiplexing gateway with no profile
        bound: fail closed), read when needed, so the backend object may be shared by the profiles
        of a process; and the host state's audit log (read from the environment each time)."""
        return backends.BuildContext(secret_lookup=hermes_profile_secret,
                                     audit_path=lambda key: RUNTIME.state.audit_path(key))

    def backend_identity(self, settings: BackendSettings) -> str:
        """What distinguishes one backend object from another in this process, beyond the settings
        (e.g. the profile whose token it holds)."""
        return ""

    def persistent_name(self, prefix: str, profile: naming.Profile, task_key: str) -> str:
        """The one sandbox ``task_key`` of ``profile`` resumes (``task_key`` as Hermes gave it: it
        may be empty, which means ``default``)."""
        return naming.persistent_name(prefix, profile, task_key or "default")

    def ephemeral_name(self, prefix: str, profile: naming.Profile, task_key: str) -> str:
        """A run-unique name, never adopted."""
        return naming.ephemeral_name(prefix, profile, task_key)

    def open_sandbox(self, backend: Backend, name: str, spec: SandboxSpec, task_key: str) -> Sandbox:
        """Resume ``name`` or create it (``Sandbox.created`` says which) for Hermes's ``task_key``.
        A session resumes its sandbox as it was made even when the settings changed since (said in
        the log; the allow-list is then reconciled, see hermes/allowlist.py)."""
        try:
            return self.open_for_task(backend, name, spec, task_key)
        except SpecMismatch as exc:
            logger.warning("%s; resuming it as it is", exc)
            return self.open_for_task(backend, name, None, task_key)

    def open_for_task(self, backend: Backend, name: str, spec: SandboxSpec | None, task_key: str) -> Sandbox:
        """``backend.open``; a plugin whose service keeps the task's identity itself (E2B) passes
        the task on."""
        return backend.open(name, spec)

    def create_ephemeral(self, backend: Backend, name: str, spec: SandboxSpec, task_key: str) -> Sandbox:
        """A new run-unique sandbox ``name`` for ``task_key``, never adopted."""
        return backend.create(name, spec, ephemeral=True)

    def working_directory(self, cwd: str, settings: BackendSettings, sandbox: Sandbox) -> str:
        """Where commands start: Hermes's own default for containers (``/root``, or ``~``) means the
        sandbox's home, which is not /root on every backend."""
        return sandbox.home if not cwd or cwd in ("~", "/root") else cwd

    def backend(self, settings: BackendSettings, *, check: bool = True) -> Backend:
        """The process-wide backend for these settings; with ``check``, BackendUnavailable when it
        cannot run here."""
        backend = RUNTIME.backend(settings, self.make_backend, self.backend_identity(settings))
        if check:
            reason = backend.unavailable_reason()
            if reason is not None:
                raise BackendUnavailable(f"the {self.backend_name} sandbox backend cannot run here: {reason}")
        return backend

    def recorded(self, sandbox: Sandbox, settings: BackendSettings, redactor: Redactor) -> RecordedSandbox:
        """The task's sandbox with its journal, the automatic checkpoints and the credentials."""
        state = RUNTIME.state
        return state.recorded(
            sandbox, redact=redactor.redact,
            checkpointing=Checkpointing(settings.auto_checkpoint, tuple(settings.protected_paths)),
            retention=Retention(settings.retention, settings.retention_min_age, settings.retention_bytes),
            health=Health(settings.health_command),
            credentials=Credentials(dict(settings.credentials), hermes_profile_secret, redactor),
            hooks=restores.hooks(state.root))

    def create_environment(
        self, *, cwd: str, timeout: int, task_id: str = "default", image: str | None = None,
        container_config: dict[str, Any] | None = None, **kwargs: Any,
    ) -> SandboxEnvironment:
        settings = self.settings()  # InvalidSettings: refuse, the message names the key
        profile = naming.resolve_profile()  # ProfileUnresolved: refuse, never borrow the default's
        cc = container_config or {}
        persistent = bool(cc.get("container_persistent", terminal_persistent()))
        if kwargs.get("probe_only") or task_id == PROBE_TASK_ID:
            # Hermes's system-prompt probe: a persistent sandbox would outlive its one command and
            # keep running next to the agent's own; an ephemeral one is destroyed at its cleanup
            persistent = False
        try:
            backend = self.backend(settings)
        except SandboxError as exc:
            raise as_hermes_error(exc) from exc
        task_key = str(task_id or "default")
        redactor = Redactor()
        prefix, spec = settings.name_prefix, settings.spec()

        def record(sandbox: Sandbox) -> RecordedSandbox:
            recorded = self.recorded(sandbox, settings, redactor)
            if sandbox.created:
                recorded.record_create()
            return recorded

        def resume() -> RecordedSandbox:
            """The persistent sandbox, its allow-list brought in line with the setting where that
            undoes nobody's change (hermes/allowlist.py); what the session must be told goes to notices."""
            recorded = record(self.open_sandbox(backend, name, spec, key))
            if recorded.inner.created:
                allowlist.remember_created(recorded, spec)
            else:
                note = allowlist.reconcile(recorded, spec)
                if note:
                    notices.append(note)
            return recorded

        reopen: Callable[[], RecordedSandbox] | None = None
        notices: list[str] = []  # shared with the environment, which tells the session once
        try:
            if persistent:
                # the task id as Hermes gave it (empty is not "default" in every plugin's names)
                key = naming.task_key_for_scope("" if task_id is None else str(task_id), settings.scope)
                name = naming.require_within_prefix(prefix, self.persistent_name(prefix, profile, key))
                recorded = resume()

                reopen = resume
            else:
                name = naming.require_within_prefix(prefix, self.ephemeral_name(prefix, profile, task_key))
                recorded = record(self.create_ephemeral(backend, name, spec, task_key))
        except SandboxError as exc:
            raise as_hermes_error(exc) from exc
        options = EnvironmentOptions(
            task_key=task_key, persistent=persistent, credentials=dict(settings.credentials),
            sync_lock=RUNTIME.sync_lock(backend, name), redactor=redactor, reopen=reopen,
            lease=RUNTIME.writer_lease(backend, name) if self.uses_writer_lease else None,
            recover=self.uses_writer_lease,  # the service keeps the sandbox when a host process dies
            notices=notices,
        )
        try:
            return SandboxEnvironment(recorded, cwd=self.working_directory(cwd, settings, recorded.inner),
                                      timeout=timeout, options=options)
        except BaseException:
            if not persistent:
                recorded.destroy()
            raise

