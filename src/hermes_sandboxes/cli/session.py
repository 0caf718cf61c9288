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
import signal
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from hermes_sandboxes import backends, config
from hermes_sandboxes.errors import InvalidInput, Unsupported
from hermes_sandboxes.identity import validate_name
from hermes_sandboxes.journal import Journal
from hermes_sandboxes.recorder import RecordedExec, RestorePreview, StoriedCheckpoint
from hermes_sandboxes.risk import CheckpointPolicy
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
)
from hermes_sandboxes.secrets import Redactor
from hermes_sandboxes.state import HostState

CliPolicy = Literal["auto", "always", "off"]
CLI_POLICIES: tuple[CliPolicy, ...] = ("auto", "always", "off")
# The CLI says "auto" (what a user expects to type); the recorder calls the same policy "risky".
_RECORDER_POLICY: dict[str, CheckpointPolicy] = {"auto": "risky", "always": "always", "off": "off"}
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASS|CRED|AUTH", re.IGNORECASE)


class Workspace:
    """The backend for one invocation, built on first use so ``--help`` never touches a store."""

    def __init__(self, backend: str | None = None, config_path: str | None = None,
                 overrides: Mapping[str, Any] | None = None) -> None:
        self._backend_name = backend
        self._config_path = config_path
        self._overrides: dict[str, Any] = dict(overrides or {})
        self._effective: config.Effective | None = None
        self._backend: Backend | None = None
        self.state = HostState(durable=False)

    def override(self, **settings: Any) -> None:
        """Command options that are backend settings (``--base``, ``--mask``); before first use."""
        if self._effective is not None:
            raise RuntimeError("settings were already read")
        self._overrides.update({k: v for k, v in settings.items() if v not in (None, (), [])})

    @property
    def effective(self) -> config.Effective:
        if self._effective is None:
            self._effective = config.load(self._backend_name, self._config_path, self._overrides)
        return self._effective

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = backends.build(self.effective.settings, self.effective.backend)
        return self._backend

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()

    def sandbox(self, name: str) -> Sandbox:
        """An existing sandbox; InvalidInput or SandboxNotFound (one-line messages) otherwise."""
        return self.backend.get(validate_name(name))

    def session(self, sandbox: Sandbox, *, policy: CliPolicy = "off",
                secrets: Mapping[str, str] | None = None) -> Session:
        return Session(sandbox, self.state, policy=policy, secrets=secrets)

    def audit(self) -> Journal:
        return self.state.audit(self.backend)

    def journal(self, name: str) -> Journal:
        return self.state.journal(self.backend, name)


class Session:
    """One sandbox through the recorder. ``recorded`` is there for what needs no wrapper here."""

    def __init__(self, sandbox: Sandbox, state: HostState, *, policy: CliPolicy = "off",
                 secrets: Mapping[str, str] | None = None) -> None:
        if policy not in CLI_POLICIES:
            raise InvalidInput(f"unknown checkpoint policy {policy!r}: use one of {', '.join(CLI_POLICIES)}")
        self.sandbox = sandbox
        self._commands = _CommandGuard(sandbox)
        kept = _secret_values(secrets or {})
        self.recorded = state.recorded(self._commands, redact=Redactor(kept).redact if kept else None,
                                       policy=_RECORDER_POLICY[policy])

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
        """Run a command, journaled, after an automatic checkpoint if the policy wants one.

        On Ctrl-C its whole process tree is killed: by ``Sandbox.exec`` while it waits, by the
        guard (below) while it starts."""
        checkpoint = None if policy is None else _RECORDER_POLICY[policy]
        return self.recorded.exec(command, checkpoint=checkpoint, cwd=cwd, env=env, timeout=timeout,
                                  on_stdout=on_stdout, on_stderr=on_stderr)

    def kill_command(self) -> None:
        """Kill the command running now, with all it started; callable from its own output sink."""
        self._commands.kill_current()

    def checkpoint(self, comment: str = "", *, health: str | None = None) -> StoriedCheckpoint:
        """A manual checkpoint; with ``health``, that command runs first and its result is part of
        the checkpoint's story."""
        if health is None:
            return self.recorded.checkpoint(comment, trigger="manual")
        self.recorded.health_command = health
        return self.recorded.checkpoint(comment, trigger="manual", health=True)

    def checkpoints(self) -> list[StoriedCheckpoint]:
        """Oldest first, with their story."""
        return self.recorded.checkpoints()

    def diff(self, from_id: str, to_id: str | None = None) -> list[FileChange]:
        backend = self.sandbox.backend
        if Capability.DIFF not in backend.capabilities:
            raise Unsupported(f"the {backend.name} backend cannot diff checkpoints")
        return self.sandbox.diff(from_id, to_id)

    def preview(self, checkpoint_id: str) -> RestorePreview:
        return self.recorded.restore_preview(checkpoint_id)

    def restore(self, checkpoint_id: str) -> None:
        self.recorded.restore(checkpoint_id)

    def delete_checkpoint(self, checkpoint_id: str) -> None:
        self.recorded.delete_checkpoint(checkpoint_id)

    def note_exec(self, command: str, exit_code: int | None, duration_s: float,
                  error: str | None = None) -> None:
        """Journal a command that ran past the recorder (the interactive shell), so the story and the
        audit log still show that something happened in the sandbox then."""
        self.recorded.record_exec(command, exit_code, duration_s, error=error)

    def destroy(self) -> None:
        self.recorded.destroy()
        if self.sandbox.ephemeral:
            # an ephemeral sandbox's own journal dies with it (else every `run` leaves a file
            # behind); its history stays in the audit log
            self.close()
            with contextlib.suppress(FileNotFoundError):
                self.recorded.journal.path.unlink()


def _secret_values(env: Mapping[str, str]) -> dict[str, str]:
    """The --env values to keep out of the journal and audit log, even inside a command line.

    Short values are left alone unless their name says secret: redacting every ``1`` of a
    ``DEBUG=1`` would garble the log without hiding anything."""
    return {k: v for k, v in env.items()
            if len(v) >= 8 or (len(v) >= 4 and _SECRET_NAME.search(k))}


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[list[int]]:
    """SIGINT and SIGTERM that arrive inside the block take effect just after it; the block sees
    them in the list it is given."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    pending: list[int] = []
    handlers = {sig: signal.signal(sig, lambda signum, _frame: pending.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield pending
    finally:
        for sig, handler in handlers.items():
            if handler is not None:  # None: installed outside Python, cannot be put back
                signal.signal(sig, handler)
        for signum in pending:
            signal.raise_signal(signum)  # now the usual handler runs (KeyboardInterrupt for Ctrl-C)


class _CommandGuard(Sandbox):
    """The sandbox, delegated to, keeping a hand on the command it started last.

    ``Sandbox.exec`` kills its command when its wait is interrupted, so Ctrl-C during a command
    (and SIGTERM during ``run``, which turns it into KeyboardInterrupt; ``run`` then destroys its
    sandbox anyway) needs nothing from here. Two cases still do, and exec covers neither:

    - an interrupt that lands while the command is being started, before exec's wait begins: the
      init may already be running it, and exec never saw its Process. Interrupts are held for the
      start and let through only once that command is killed;
    - an output sink whose reader has gone (``exec box -- yes | head``) must kill the command,
      and exec does not hand its Process out: ``kill_current()`` does, from inside the sink.
    """

    def __init__(self, inner: Sandbox) -> None:
        self._inner = inner
        self.name = inner.name
        self.ephemeral = inner.ephemeral
        self._current: Process | None = None

    def kill_current(self) -> None:
        if self._current is not None:
            self._current.kill()

    def start(self, command: Command, *, cwd: str | None = None, env: Mapping[str, str] | None = None,
              stdin: bytes | None = None, on_stdout: OutputSink | None = None,
              on_stderr: OutputSink | None = None) -> Process:
        with _interrupts_deferred() as interrupted:
            proc = self._inner.start(command, cwd=cwd, env=env, stdin=stdin, on_stdout=on_stdout,
                                     on_stderr=on_stderr)
            self._current = proc
            if interrupted:
                proc.kill()
        return proc

    @property
    def backend(self) -> Backend:
        return self._inner.backend

    def info(self) -> SandboxInfo:
        return self._inner.info()

    def stop(self) -> None:
        self._inner.stop()

    @property
    def home(self) -> str:  # type: ignore[override]
        return self._inner.home

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

    def delete_checkpoint(self, checkpoint_id: str) -> None:
        self._inner.delete_checkpoint(checkpoint_id)

    def diff(self, from_id: str, to_id: str | None = None) -> list[FileChange]:
        return self._inner.diff(from_id, to_id)

    def destroy(self) -> None:
        self._inner.destroy()
