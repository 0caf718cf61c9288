"""The CLI's one place that knows how sandboxes are reached and recorded.

``Workspace`` holds the backend the user chose (``--backend``, the config file, ``-o`` overrides),
built through the registry: the CLI speaks only the contract and never names a backend.
``Session`` is one sandbox as the CLI uses it: always through ``RecordedSandbox`` (built by the host
state's one factory), so every command, checkpoint, restore and deletion goes to the sandbox's
journal and to the audit log, and checkpoints tell their story.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping

from hermes_sandboxes import backends
from hermes_sandboxes.cli import settings_cache
from hermes_sandboxes.cli.owners import Owners
from hermes_sandboxes.errors import InvalidInput, SandboxError, SandboxNotFound, Unsupported
from hermes_sandboxes.hermes.sync import restores
from hermes_sandboxes.names import unique_name, validate_name
from hermes_sandboxes.recorder.credentials import Redactor
from hermes_sandboxes.recorder.journal import Journal
from hermes_sandboxes.recorder.options import DEFAULT_MIN_AGE, DEFAULT_RETENTION, Checkpointing, Health, Retention
from hermes_sandboxes.recorder.sandbox import RecordedExec, RestorePreview, StoriedCheckpoint
from hermes_sandboxes.recorder.state import HostState
from hermes_sandboxes.sandbox import (
    Backend,
    Capability,
    Command,
    FileChange,
    OutputSink,
    Sandbox,
    SandboxSpec,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:  # both import what the hot path (exec) avoids: pydantic, the risk parser
    from typing import Any, Literal

    from hermes_sandboxes.cli import config
    from hermes_sandboxes.risk import CheckpointPolicy

    CliPolicy = Literal["risky", "always", "off"]

# The names of the settings' auto_checkpoint and of the recorder; "auto", the CLI's old word for
# "risky", is still taken (OLD_SPELLINGS) so that scripts written for it keep working.
CLI_POLICIES: tuple[CliPolicy, ...] = ("risky", "always", "off")
OLD_SPELLINGS: dict[str, CliPolicy] = {"auto": "risky"}
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASS|CRED|AUTH", re.IGNORECASE)


def cli_policy(setting: object) -> CliPolicy:
    """The ``--checkpoint`` value the ``auto_checkpoint`` setting means (the same name; its default:
    risky)."""
    text = str(setting)
    return text if text in CLI_POLICIES else "risky"


def recorder_policy(policy: str) -> CheckpointPolicy:
    """The checkpoint policy ``policy`` names (an old spelling included); InvalidInput otherwise."""
    policy = OLD_SPELLINGS.get(policy, policy)
    if policy not in CLI_POLICIES:
        raise InvalidInput(f"unknown checkpoint policy {policy!r}: use one of {', '.join(CLI_POLICIES)}")
    return policy


class Workspace:
    """The backend for one invocation, built on first use so ``--help`` never touches a store."""

    def __init__(self, backend: str | None = None, config_path: str | None = None,
                 overrides: Mapping[str, Any] | None = None, labels: Mapping[str, str] | None = None, *,
                 state: HostState | None = None) -> None:
        self._backend_name = backend
        self._config_path = config_path
        self._overrides: dict[str, Any] = dict(overrides or {})
        self._labels: dict[str, str] = dict(labels or {})  # where each override came from: "--home"...
        self._effective: config.Effective | None = None
        self._values: dict[str, Any] | None = None  # the effective settings as plain values
        self._backend: Backend | None = None
        self.state = state if state is not None else HostState(durable=False)
        self.collect_orphans = True  # the first use of the backend collects dead runs' sandboxes
        self.on_collect: Callable[[str], None] | None = None

    def override(self, labels: Mapping[str, str], **settings: Any) -> None:
        """Command options that are backend settings (``--base``, ``--mask``, named by ``labels``);
        before first use."""
        if self._effective is not None:
            raise RuntimeError("settings were already read")
        given = {k: v for k, v in settings.items() if v not in (None, (), [])}
        self._overrides.update(given)
        self._labels.update({k: labels[k] for k in given if k in labels})

    @property
    def effective(self) -> config.Effective:
        if self._effective is None:
            from hermes_sandboxes.cli import config

            self._effective = config.load(self._backend_name, self._config_path, self._overrides, self._labels)
            if backends.entry(self._effective.backend).from_values is not None:
                # only backends that can be built from plain values, which hold no secret (the
                # cloud backends' settings may carry a token: never written to disk)
                settings_cache.store(self.state.root, self._cache_key(), self._effective.backend,
                                     self._effective.settings.model_dump(mode="json"))
        return self._effective

    def _cache_key(self) -> str:
        return settings_cache.key(self._backend_name, self._config_path, self._overrides)

    def cached_backend(self) -> bool:
        """Build the backend from the settings cache (no validation, no pydantic), if it has them."""
        hit = settings_cache.lookup(self.state.root, self._cache_key())
        if hit is None:
            return False
        built = backends.build_from_values(*hit, context=self.build_context())
        if built is None:
            return False
        self._values = hit[1]
        self.use(built)
        return True

    @property
    def values(self) -> Mapping[str, Any]:
        """The effective settings as plain values (from the settings cache on the fast path)."""
        if self._values is None:
            self._values = self.effective.settings.model_dump(mode="json")
        return self._values

    def default_policy(self) -> CliPolicy:
        """``exec``'s ``--checkpoint`` when it is not given: what ``auto_checkpoint`` says."""
        return cli_policy(self.values.get("auto_checkpoint"))

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self.use(backends.build(self.effective.settings, self.effective.backend, context=self.build_context()))
        assert self._backend is not None
        return self._backend

    def build_context(self) -> backends.BuildContext:
        """What the CLI tells a backend it builds: its audit log goes under this state directory."""
        return backends.BuildContext(audit_path=self.state.audit_path)

    def use(self, backend: Backend) -> None:
        """Use ``backend`` (built by the registry, or given by an embedding program or a test)."""
        self._backend = backend
        if self.collect_orphans:
            # by the way: a sandbox we cannot collect now (busy, unreachable) waits for the next call,
            # and never fails the command the user asked for
            with contextlib.suppress(SandboxError, OSError):
                self.collect()

    @property
    def owners(self) -> Owners:
        return Owners(self.state.backend_dir(self.backend.key) / "owners")

    def create_owned(self, spec: SandboxSpec) -> Sandbox:
        """A new ephemeral ``run-...`` sandbox owned by this process: if we die, however we die,
        the next CLI call collects it (see owners.py)."""
        name = unique_name("run")
        owners = self.owners
        owners.claim(name)
        try:
            return self.backend.create(name, spec, ephemeral=True)
        except BaseException:
            owners.release(name)
            raise

    def release(self, name: str) -> None:
        self.owners.release(name)

    def collect(self) -> list[str]:
        """Destroy the ``run`` sandboxes whose owner died; their names."""
        owners, collected = self.owners, []
        for name in owners.orphans():
            try:
                session = self.session(self.backend.get(name))
            except SandboxNotFound:
                owners.release(name)  # its owner died before creating it, or after destroying it
                continue
            try:
                session.recorded.settle()  # the command its owner died running ends in the record too
                session.destroy()
            except SandboxError:
                continue  # busy or unreachable now: left for the next call
            finally:
                session.close()
            owners.release(name)
            collected.append(name)
            if self.on_collect is not None:
                self.on_collect(name)
        return collected

    def settle(self) -> list[str]:
        """Record the end, as lost, of every command whose recording process died before it ended,
        in every sandbox of the backend; the sandboxes that had any."""
        settled = []
        for info in self.backend.list():
            try:
                session = self.session(self.backend.get(info.name))
            except SandboxNotFound:
                continue  # destroyed since it was listed
            try:
                if session.recorded.settle():
                    settled.append(info.name)
            finally:
                session.close()
        return settled

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()

    def sandbox(self, name: str) -> Sandbox:
        """An existing sandbox; InvalidInput or SandboxNotFound (one-line messages) otherwise."""
        return self.backend.get(validate_name(name))

    def session(self, sandbox: Sandbox, *, policy: CliPolicy = "off",
                secrets: Mapping[str, str] | None = None) -> Session:
        return Session(sandbox, self.state, policy=policy, secrets=secrets, settings=self.values)

    def audit(self) -> Journal:
        return self.state.audit(self.backend)

    def journal(self, name: str) -> Journal:
        return self.state.journal(self.backend, name)


class Session:
    """One sandbox through the recorder. ``recorded`` is there for what needs no wrapper here."""

    def __init__(self, sandbox: Sandbox, state: HostState, *, policy: CliPolicy = "off",
                 secrets: Mapping[str, str] | None = None, settings: Mapping[str, Any] | None = None) -> None:
        chosen = recorder_policy(policy)
        self.sandbox = sandbox
        self._state = state
        kept = _secret_values(secrets or {})
        # the hooks of a sandbox Hermes may use: a restore from here is noted for its sessions, and
        # its housekeeping is recorded as such (hermes/sync/restores.py)
        self.recorded = state.recorded(sandbox, redact=Redactor(kept).redact if kept else None,
                                       hooks=restores.hooks(state.root),
                                       **recorder_options(chosen, settings or {}))

    @property
    def name(self) -> str:
        return self.sandbox.name

    def close(self) -> None:
        self.recorded.journal.close()

    def record_create(self, *, forked_from: str | None = None) -> None:
        self.recorded.record_create(forked_from=forked_from)

    def exec(self, command: Command, *, policy: CliPolicy | None = None, cwd: str | None = None,
             env: Mapping[str, str] | None = None, timeout: float | None = None,
             on_stdout: OutputSink | None = None, on_stderr: OutputSink | None = None) -> RecordedExec:
        """Run a command, journaled, after an automatic checkpoint if the policy wants one (the
        demo's way; ``exec`` and ``run`` go through ``running.run_command``)."""
        checkpoint = None if policy is None else recorder_policy(policy)
        return self.recorded.exec(command, checkpoint=checkpoint, cwd=cwd, env=env, timeout=timeout,
                                  on_stdout=on_stdout, on_stderr=on_stderr)

    def checkpoint(self, comment: str = "", *, health: str | None = None,
                   health_timeout: float | None = 600.0) -> StoriedCheckpoint:
        """A manual checkpoint; with ``health``, that command runs first (for at most
        ``health_timeout`` seconds) and its result is part of the checkpoint's story."""
        if health is None:
            return self.recorded.checkpoint(comment, trigger="manual")
        self.recorded.health = Health(health, health_timeout)
        return self.recorded.checkpoint(comment, trigger="manual", health=True)

    def checkpoints(self, *, include_internal: bool = False) -> list[StoriedCheckpoint]:
        """Oldest first, with their story (``include_internal``: with the framework's own commands
        and the checkpoints a service made by itself)."""
        return self.recorded.checkpoints(include_internal=include_internal)

    def diff(self, from_id: str, to_id: str | None = None) -> list[FileChange]:
        backend = self.sandbox.backend
        if Capability.DIFF not in backend.capabilities:
            raise Unsupported(f"the {backend.name} backend cannot diff checkpoints")
        return self.sandbox.diff(from_id, to_id)

    def preview(self, checkpoint_id: str, *, diff: bool = True, settle: bool = False) -> RestorePreview:
        """What a restore to ``checkpoint_id`` throws away (see ``RecordedSandbox.restore_preview``)."""
        return self.recorded.restore_preview(checkpoint_id, diff=diff, settle=settle)

    def restore(self, checkpoint: str | RestorePreview) -> None:
        """Restore, recorded; given the preview, what it found is used as it is."""
        self.recorded.restore(checkpoint)

    def delete_checkpoint(self, checkpoint_id: str) -> None:
        self.recorded.delete_checkpoint(checkpoint_id)

    def destroy(self) -> None:
        self.recorded.destroy()  # its writer lease files too, unless a Hermes process still holds them
        if self.sandbox.ephemeral:
            # an ephemeral sandbox's own journal dies with it (else every `run` leaves a file
            # behind); its history stays in the audit log
            self.close()
            journal = self.recorded.journal.path
            sidecars = (".allow.lock", ".allow.applied", ".allow.warned", ".restored")  # its lock and notes
            for path in (journal, *(journal.with_name(journal.name + end) for end in sidecars)):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()


def recorder_options(policy: CheckpointPolicy, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The recorder's options from the effective settings values (absent keys: its defaults)."""
    retention = Retention(keep=settings.get("retention", DEFAULT_RETENTION),
                          min_age=settings.get("retention_min_age", DEFAULT_MIN_AGE),
                          budget=settings.get("retention_bytes"))
    return {"checkpointing": Checkpointing(policy, tuple(settings.get("protected_paths") or ())),
            "retention": retention, "health": Health(settings.get("health_command"))}


def _secret_values(env: Mapping[str, str]) -> dict[str, str]:
    """The --env values to keep out of the journal and audit log, even inside a command line.

    Short values are left alone unless their name says secret: redacting every ``1`` of a
    ``DEBUG=1`` would garble the log without hiding anything."""
    return {k: v for k, v in env.items()
            if len(v) >= 8 or (len(v) >= 4 and _SECRET_NAME.search(k))}
