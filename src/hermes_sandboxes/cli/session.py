"""The CLI's one place that knows how sandboxes are reached and recorded.

``Workspace`` holds the backend for the ``--home`` the user chose. ``Session`` is one sandbox as the
CLI uses it: always through ``RecordedSandbox``, so every command, checkpoint, restore and deletion
goes to the sandbox's journal and to the audit log, and checkpoints tell their story.
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Literal

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from hermes_sandboxes.errors import InvalidInput, Unsupported
from hermes_sandboxes.identity import validate_name
from hermes_sandboxes.journal import Journal, audit_path, journal_path
from hermes_sandboxes.recorder import RecordedExec, RecordedSandbox, RestorePreview
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

CliPolicy = Literal["auto", "always", "off"]
CLI_POLICIES: tuple[CliPolicy, ...] = ("auto", "always", "off")
# The CLI says "auto" (what a user expects to type); the recorder calls the same policy "risky".
_RECORDER_POLICY: dict[str, CheckpointPolicy] = {"auto": "risky", "always": "always", "off": "off"}
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASS|CRED|AUTH", re.IGNORECASE)


class Workspace:
    """The backend for one invocation, built on first use so ``--help`` never touches the store."""

    def __init__(self, home: str | None) -> None:
        self._home = home
        self._backend: LocalBackend | None = None

    @property
    def backend(self) -> LocalBackend:
        if self._backend is None:
            self._backend = LocalBackend(self._home)
        return self._backend

    @property
    def home(self) -> Path:
        return self.backend.home

    def sandbox(self, name: str) -> LocalSandbox:
        """An existing sandbox; InvalidInput or SandboxNotFound (one-line messages) otherwise."""
        return self.backend.get(validate_name(name))

    def session(self, sandbox: Sandbox, *, policy: CliPolicy = "off",
                secrets: Mapping[str, str] | None = None) -> Session:
        return Session(sandbox, self.home, policy=policy, secrets=secrets)

    def audit(self) -> Journal:
        return Journal(audit_path(self.home), durable=False)

    def journal(self, name: str) -> Journal:
        return Journal(journal_path(self.home, name), durable=False)


class Session:
    """One sandbox through the recorder. ``recorded`` is there for what needs no wrapper here."""

    def __init__(self, sandbox: Sandbox, home: Path, *, policy: CliPolicy = "off",
                 secrets: Mapping[str, str] | None = None) -> None:
        if policy not in CLI_POLICIES:
            raise InvalidInput(f"unknown checkpoint policy {policy!r}: use one of {', '.join(CLI_POLICIES)}")
        self.home = home
        self.sandbox = sandbox
        self._commands = _CommandGuard(sandbox)
        kept = _secret_values(secrets or {})
        self.recorded = RecordedSandbox.at_home(self._commands, home, redact=Redactor(kept).redact if kept else None,
                                                policy=_RECORDER_POLICY[policy])

    @property
    def name(self) -> str:
        return self.sandbox.name

    def close(self) -> None:
        self.recorded.journal.close()

    def record_create(self) -> None:
        self.recorded.record_create()

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

    def checkpoint(self, comment: str = "", *, health: str | None = None) -> Checkpoint:
        """A manual checkpoint; with ``health``, that command runs first and its result is part of
        the checkpoint's story."""
        if health is None:
            return self.recorded.checkpoint(comment, trigger="manual")
        self.recorded.health_command = health
        return self.recorded.checkpoint(comment, trigger="manual", health=True)

    def checkpoints(self) -> list[Checkpoint]:
        """Oldest first, with the story in ``extra``."""
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
