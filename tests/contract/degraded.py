"""A real backend with fewer capabilities: the local backend behind a wrapper that hides diff,
checkpoint deletion, tree kill, fork, the terminal, the egress allow-list and killing by tag, so the degraded paths
of the recorder, the CLI and the agent tools run for real against a backend that cannot do those
things.

It is registered in the backend registry as ``local-degraded`` (settings: the local backend's), the
way a third-party backend would be; nothing of ours is patched.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Literal

from hermes_sandboxes import backends
from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.backends.local.settings import LocalSettings
from hermes_sandboxes.errors import Unsupported
from hermes_sandboxes.sandbox import (
    Backend,
    Capability,
    Checkpoint,
    Command,
    FileChange,
    OutputSink,
    Process,
    Sandbox,
    SandboxInfo,
    SandboxSpec,
    Stdin,
)
from hermes_sandboxes.settings import BackendSettings

WRAPPER_REFUSED = "degraded test wrapper: called although the capability is not declared: "

HIDDEN = frozenset({Capability.DIFF, Capability.DELETE_CHECKPOINTS, Capability.TREE_KILL, Capability.FORK,
                    Capability.TERMINAL, Capability.CHEAP_CHECKPOINTS, Capability.EGRESS_ALLOWLIST,
                    Capability.KILL_TAGGED})
NAME = "local-degraded"


class DegradedSettings(LocalSettings):
    backend: Literal["local-degraded"] = "local-degraded"  # type: ignore[assignment]


class DegradedSandbox(Sandbox):
    def __init__(self, backend: DegradedBackend, inner: Sandbox) -> None:
        self._backend = backend
        self._inner = inner
        self.name = inner.name
        self.ephemeral = inner.ephemeral
        self.created = inner.created
        self.home = inner.home

    @property
    def backend(self) -> DegradedBackend:
        return self._backend

    def info(self) -> SandboxInfo:
        info = self._inner.info()
        return SandboxInfo(info.name, NAME, info.ephemeral, info.state, info.created_at, info.spec,
                           info.layer_bytes, info.checkpoint_count)

    def stop(self) -> None:
        self._inner.stop()

    def start(self, command: Command, *, cwd: str | None = None, env: Mapping[str, str] | None = None,
              stdin: Stdin = None, on_stdout: OutputSink | None = None,
              on_stderr: OutputSink | None = None, tag: str | None = None) -> Process:
        # no KILL_TAGGED here: a tag names nothing this backend can kill later, so it is not passed on
        return self._inner.start(command, cwd=cwd, env=env, stdin=stdin, on_stdout=on_stdout, on_stderr=on_stderr)

    def read_file(self, path: str) -> bytes:
        return self._inner.read_file(path)

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._inner.write_file(path, data, mode)

    def delete_file(self, path: str) -> None:
        self._inner.delete_file(path)

    def checkpoint(self, comment: str = "") -> Checkpoint:
        return self._inner.checkpoint(comment)

    def checkpoints(self) -> list[Checkpoint]:
        return self._inner.checkpoints()

    def restore(self, checkpoint_id: str) -> None:
        self._inner.restore(checkpoint_id)

    # Worded unlike any message of ours, so that a test of a face's refusal sees the face's own check
    # of the capability, not this wrapper's error passed through.
    def delete_checkpoint(self, checkpoint_id: str) -> None:
        raise Unsupported(WRAPPER_REFUSED + "delete_checkpoint")

    def diff(self, from_id: str, to_id: str | None = None) -> list[FileChange]:
        raise Unsupported(WRAPPER_REFUSED + "diff")

    def destroy(self) -> None:
        self._inner.destroy()


class DegradedBackend(Backend):
    name = NAME

    def __init__(self, inner: LocalBackend) -> None:
        self.inner = inner
        self.capabilities = inner.capabilities - HIDDEN

    @property
    def key(self) -> str:
        return f"{NAME}-{self.inner.key}"

    def unavailable_reason(self) -> str | None:
        return self.inner.unavailable_reason()

    def check_spec(self, spec: SandboxSpec) -> None:
        super().check_spec(spec)
        self.inner.check_spec(spec)

    def _wrap(self, sandbox: Sandbox) -> DegradedSandbox:
        return DegradedSandbox(self, sandbox)

    def open(self, name: str, spec: SandboxSpec | None = None) -> Sandbox:
        return self._wrap(self.inner.open(name, spec))

    def create(self, name: str, spec: SandboxSpec | None = None, *, ephemeral: bool = False) -> Sandbox:
        return self._wrap(self.inner.create(name, spec, ephemeral=ephemeral))

    def create_ephemeral(self, spec: SandboxSpec | None = None, prefix: str = "tmp") -> Sandbox:
        return self._wrap(self.inner.create_ephemeral(spec, prefix))

    def get(self, name: str) -> Sandbox:
        return self._wrap(self.inner.get(name))

    def list(self) -> builtins.list[SandboxInfo]:
        return [SandboxInfo(i.name, NAME, i.ephemeral, i.state, i.created_at, i.spec, i.layer_bytes,
                            i.checkpoint_count) for i in self.inner.list()]


def build_backend(settings: BackendSettings) -> DegradedBackend:
    assert isinstance(settings, DegradedSettings)
    return DegradedBackend(LocalBackend(settings.store_home(), base=settings.base, masks=settings.masks))


def register() -> None:
    backends.register(backends.BackendEntry(
        NAME, "the local backend without diff, checkpoint deletion, tree kill, fork, terminal, allow-list (tests)",
        "tests.contract.degraded:DegradedSettings", "tests.contract.degraded:build_backend"))
