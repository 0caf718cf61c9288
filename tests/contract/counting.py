"""A real backend that counts: the local backend behind a wrapper that forwards every method of the
contract and counts the calls (``CountingBackend.calls``), and a host state whose journals count
their readings (``CountingState.reads``). A first-class test double implementing the contract, so
a test can say how often a face lists checkpoints or folds a journal without patching anything.
"""

from __future__ import annotations

import builtins
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from hermes_sandboxes.recorder.journal import Journal, RedactFn
from hermes_sandboxes.recorder.state import HostState
from hermes_sandboxes.sandbox import (
    Backend,
    Checkpoint,
    Command,
    ExecResult,
    FileChange,
    OutputSink,
    Process,
    Sandbox,
    SandboxInfo,
    SandboxSpec,
    Stdin,
)


class CountingSandbox(Sandbox):
    def __init__(self, backend: CountingBackend, inner: Sandbox) -> None:
        self._backend = backend
        self._inner = inner
        self.name = inner.name
        self.ephemeral = inner.ephemeral
        self.created = inner.created
        self.home = inner.home

    def _count(self, what: str) -> None:
        self._backend.calls[what] += 1

    @property
    def backend(self) -> CountingBackend:
        return self._backend

    def info(self) -> SandboxInfo:
        self._count("info")
        return self._inner.info()

    def stop(self) -> None:
        self._count("stop")
        self._inner.stop()

    def reserve(self, seconds: float) -> None:
        self._inner.reserve(seconds)

    def start(self, command: Command, *, cwd: str | None = None, env: Mapping[str, str] | None = None,
              stdin: Stdin = None, on_stdout: OutputSink | None = None, on_stderr: OutputSink | None = None,
              tag: str | None = None) -> Process:
        self._count("start")
        return self._inner.start(command, cwd=cwd, env=env, stdin=stdin, on_stdout=on_stdout, on_stderr=on_stderr,
                                 tag=tag)

    def exec(self, command: Command, *, cwd: str | None = None, env: Mapping[str, str] | None = None,
             stdin: Stdin = None, timeout: float | None = None, on_stdout: OutputSink | None = None,
             on_stderr: OutputSink | None = None, capture_limit: int = 256 * 1024,
             tag: str | None = None) -> ExecResult:
        self._count("exec")
        return self._inner.exec(command, cwd=cwd, env=env, stdin=stdin, timeout=timeout, on_stdout=on_stdout,
                                on_stderr=on_stderr, capture_limit=capture_limit, tag=tag)

    def read_file(self, path: str) -> bytes:
        return self._inner.read_file(path)

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._inner.write_file(path, data, mode)

    def delete_file(self, path: str) -> None:
        self._inner.delete_file(path)

    def checkpoint(self, comment: str = "") -> Checkpoint:
        self._count("checkpoint")
        return self._inner.checkpoint(comment)

    def checkpoints(self) -> list[Checkpoint]:
        self._count("checkpoints")
        return self._inner.checkpoints()

    def restore(self, checkpoint_id: str) -> None:
        self._count("restore")
        self._inner.restore(checkpoint_id)

    def delete_checkpoint(self, checkpoint_id: str) -> None:
        self._count("delete_checkpoint")
        self._inner.delete_checkpoint(checkpoint_id)

    def diff(self, from_id: str, to_id: str | None = None) -> list[FileChange]:
        self._count("diff")
        return self._inner.diff(from_id, to_id)

    def changed_since(self, checkpoint_id: str) -> bool | None:
        self._count("changed_since")
        return self._inner.changed_since(checkpoint_id)

    def oom_kills(self) -> int | None:
        self._count("oom_kills")
        return self._inner.oom_kills()

    def attach(self, command: Command, fds: tuple[int, int, int], *, cwd: str | None = None,
               env: Mapping[str, str] | None = None, tag: str | None = None) -> Process:
        return self._inner.attach(command, fds, cwd=cwd, env=env, tag=tag)

    def kill_tagged(self, tag: str) -> bool:
        self._count("kill_tagged")
        return self._inner.kill_tagged(tag)

    def set_allow(self, allow: Sequence[str]) -> None:
        self._inner.set_allow(allow)

    def open_terminal(self) -> tuple[int, int]:
        return self._inner.open_terminal()

    def destroy(self) -> None:
        self._count("destroy")
        self._inner.destroy()


class CountingBackend(Backend):
    name = "local-counting"

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.capabilities = inner.capabilities
        self.calls: Counter[str] = Counter()

    @property
    def key(self) -> str:
        return f"counting-{self.inner.key}"

    def unavailable_reason(self) -> str | None:
        return self.inner.unavailable_reason()

    def check_spec(self, spec: SandboxSpec) -> None:
        self.inner.check_spec(spec)

    def open(self, name: str, spec: SandboxSpec | None = None) -> Sandbox:
        return CountingSandbox(self, self.inner.open(name, spec))

    def create(self, name: str, spec: SandboxSpec | None = None, *, ephemeral: bool = False) -> Sandbox:
        return CountingSandbox(self, self.inner.create(name, spec, ephemeral=ephemeral))

    def create_ephemeral(self, spec: SandboxSpec | None = None, prefix: str = "tmp") -> Sandbox:
        return CountingSandbox(self, self.inner.create_ephemeral(spec, prefix))

    def get(self, name: str) -> Sandbox:
        return CountingSandbox(self, self.inner.get(name))

    def list(self) -> builtins.list[SandboxInfo]:
        self.calls["list"] += 1
        return self.inner.list()


class CountingJournal(Journal):
    def __init__(self, path: Path, reads: Counter[str], **options: Any) -> None:
        super().__init__(path, **options)
        self._reads = reads

    def raw(self) -> Iterator[dict[str, Any]]:
        self._reads[self.path.name] += 1
        return super().raw()


class CountingState(HostState):
    """Host state whose journals and audit logs count how often they are read (by file name)."""

    def __init__(self, root: Path, *, durable: bool = False) -> None:
        super().__init__(root, durable=durable)
        self.reads: Counter[str] = Counter()

    def journal(self, backend: Backend, sandbox: str, redact: RedactFn | None = None) -> Journal:
        return CountingJournal(self.journal_path(backend.key, sandbox), self.reads, durable=self.durable,
                               redact=redact)

    def audit(self, backend: Backend, redact: RedactFn | None = None) -> Journal:
        return CountingJournal(self.audit_path(backend.key), self.reads, durable=self.durable, redact=redact)
