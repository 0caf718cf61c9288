"""A command on the recorded path (``RecordedSandbox.start``/``exec``): the options both take,
what is worked out before it starts, and the started process whose end is journaled once."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

from hermes_sandboxes.errors import SandboxError
from hermes_sandboxes.sandbox import Process
from hermes_sandboxes.util.values import dataclass

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from typing import TypedDict

    from hermes_sandboxes.recorder.credentials import CredentialPlan
    from hermes_sandboxes.recorder.sandbox import RecordedSandbox, StoriedCheckpoint
    from hermes_sandboxes.risk import CheckpointPolicy, RiskVerdict
    from hermes_sandboxes.sandbox import OutputSink, Stdin


if TYPE_CHECKING:  # a TypedDict is for type checkers only (typing stays off the hot path)

    class CommandOptions(TypedDict, total=False):
        """What ``RecordedSandbox.start`` and ``exec`` take besides the command.

        ``record_as``: the command line to classify and record when the command wraps it (Hermes's
        shell wrapper). ``checkpoint``: the checkpoint policy for this command (default: the
        sandbox's). ``auto_checkpoint``: the automatic checkpoint the caller took itself just before
        (the CLI, to announce it first); none is taken then. ``origin``: tags for the record (task,
        session). ``internal``: the agent's own housekeeping (never checkpointed, hidden from stories
        by default). ``cwd``, ``env``, ``stdin``, ``on_stdout``, ``on_stderr``: passed to the sandbox;
        ``env`` is never recorded."""

        record_as: str | None
        checkpoint: CheckpointPolicy | None
        auto_checkpoint: StoriedCheckpoint | None
        origin: Mapping[str, str] | None
        internal: bool
        cwd: str | None
        env: Mapping[str, str] | None
        stdin: Stdin
        on_stdout: OutputSink | None
        on_stderr: OutputSink | None


@dataclass(frozen=True)
class _Prepared:
    """A command ready to start: what ``RecordedSandbox._prepare`` worked out."""

    text: str
    env: dict[str, str]
    tags: dict[str, str]
    plan: CredentialPlan
    auto: StoriedCheckpoint | None
    verdict: RiskVerdict
    internal: bool
    id: str  # of the record written ahead
    tagged: dict[str, str]  # the tag to start it with (``Sandbox.start``), where the backend takes one


class RecordedProcess(Process):
    """A started command whose end is journaled once: when ``wait()`` sees it end (exit code or a
    lost sandbox). ``kill()`` marks it killed by us. The checkpoint taken before it, if any, is
    ``auto_checkpoint``."""

    def __init__(self, recorder: RecordedSandbox, inner: Process, command: str, *, origin: Mapping[str, str],
                 internal: bool, auto_checkpoint: StoriedCheckpoint | None, verdict: RiskVerdict,
                 credentials: CredentialPlan, exec_id: str | None = None) -> None:
        self._recorder = recorder
        self.exec_id = exec_id
        self._inner = inner
        self._command = command
        self._origin = dict(origin)
        self._internal = internal
        self._started = time.monotonic()
        self._killed = False
        self._recorded = False
        self._lock = threading.Lock()
        self.auto_checkpoint = auto_checkpoint
        self.verdict = verdict
        self.credentials = credentials

    @property
    def inner(self) -> Process:
        return self._inner

    @property
    def returncode(self) -> int | None:
        return self._inner.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            code = self._inner.wait(timeout)
        except SandboxError as exc:
            self.record(None, error=str(exc))
            raise
        if code is not None:
            self.record(code)
        return code

    def kill(self) -> None:
        self._killed = True
        self._inner.kill()

    def record(self, exit_code: int | None, *, timed_out: bool = False, error: str | None = None,
               killed: bool = False) -> None:
        """Journal how the command ended (once; later calls are ignored)."""
        with self._lock:
            if self._recorded:
                return
            self._recorded = True
        self._recorder.record_exec(self._command, exit_code, time.monotonic() - self._started,
                                   timed_out=timed_out, origin=self._origin, error=error,
                                   killed=killed or self._killed, internal=self._internal, exec_id=self.exec_id)
