"""A command on the recorded path (``RecordedSandbox.start``/``exec``): the options both take,
what is worked out before it starts, and the started process whose end is journaled once, however
it ends: its exit, a timeout, a kill with a reason (a broken pipe, an interrupt), the sandbox's
memory limit, or a lost sandbox. A face never needs the backend's process itself."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

from hermes_sandboxes.errors import SandboxError
from hermes_sandboxes.sandbox import KILL_GRACE_S, TIMEOUT_EXIT_CODE, Process
from hermes_sandboxes.util.values import dataclass

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from typing import TypedDict

    from hermes_sandboxes.recorder.credentials import CredentialPlan
    from hermes_sandboxes.recorder.sandbox import OnCheckpoint, RecordedSandbox, StoriedCheckpoint
    from hermes_sandboxes.risk import CheckpointPolicy, RiskVerdict
    from hermes_sandboxes.sandbox import OutputSink, Stdin

KILLED_EXIT_CODE = 137  # 128 + SIGKILL: what a memory limit's kill ends a command with
MEMORY_KILL = "killed by the sandbox's memory limit"

if TYPE_CHECKING:  # a TypedDict is for type checkers only (typing stays off the hot path)

    class CommandOptions(TypedDict, total=False):
        """What ``RecordedSandbox.start`` and ``exec`` take besides the command.

        ``record_as``: the command line to classify and record when the command wraps it (Hermes's
        shell wrapper). ``checkpoint``: the checkpoint policy for this command (default: the
        sandbox's). ``on_checkpoint(checkpoint, verdict, new)``: told, before the command starts,
        of the automatic checkpoint that protects it (``new``: taken for it, rather than an earlier
        one reused because nothing changed since), e.g. to say how to undo it. ``origin``: tags for
        the record (task, session). ``internal``: the agent's own housekeeping (never checkpointed,
        hidden from stories by default). ``cwd``, ``env``, ``stdin``, ``on_stdout``, ``on_stderr``:
        passed to the sandbox; ``env`` is never recorded."""

        record_as: str | None
        checkpoint: CheckpointPolicy | None
        on_checkpoint: OnCheckpoint | None
        origin: Mapping[str, str] | None
        internal: bool
        cwd: str | None
        env: Mapping[str, str] | None
        stdin: Stdin
        on_stdout: OutputSink | None
        on_stderr: OutputSink | None


@dataclass(frozen=True)
class Prepared:
    """A command ready to start: what ``RecordedSandbox`` worked out before it starts."""

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
    """A started command whose end is journaled once, whichever of these comes first: ``wait()``
    sees it end (its exit code, or a lost sandbox), ``finish()`` is told its code, or ``stop()``
    ends it. ``kill(why)`` marks it killed by us, with why. An exit by SIGKILL while the sandbox's
    memory limit killed something is recorded as that (``out_of_memory``). The checkpoint taken
    before it, if any, is ``auto_checkpoint``."""

    def __init__(self, recorder: RecordedSandbox, inner: Process, ready: Prepared, *,
                 oom_before: int | None = None) -> None:
        self._recorder = recorder
        self.exec_id = ready.id
        self._inner = inner
        self._command = ready.text
        self._origin = dict(ready.tags)
        self._internal = ready.internal
        self._started = time.monotonic()
        self._killed = False
        self._why: str | None = None
        self._oom_before = oom_before
        self._recorded = False
        self._lock = threading.Lock()
        self.auto_checkpoint = ready.auto
        self.verdict = ready.verdict
        self.credentials = ready.plan
        self.out_of_memory = False

    @property
    def returncode(self) -> int | None:
        """The exit code once it ended, else None."""
        return self._inner.returncode

    def wait(self, timeout: float | None = None, *, record: bool = True) -> int | None:
        """The exit code, or None when ``timeout`` passed first. Its end is journaled when it ended
        (unless ``record`` is False: the caller then calls ``finish``). A lost sandbox is journaled
        and raised (SandboxError)."""
        try:
            code = self._inner.wait(timeout)
        except SandboxError as exc:
            self.record(None, error=str(exc))
            raise
        if code is not None and record:
            self.finish(code)
        return code

    def kill(self, why: str | None = None) -> None:
        """Kill the command (and, where the backend can, all it started); its end is recorded as
        killed by us, with ``why`` when given (the first reason given is kept)."""
        self._killed = True
        if why is not None and self._why is None:
            self._why = why
        self._inner.kill()

    def stop(self, why: str | None = None, *, timed_out: bool = False) -> int | None:
        """Kill it, wait a bounded time for it to be gone, and journal it as killed (``timed_out``:
        as a timeout, exit 124). Its exit code, None when it did not go in time."""
        code: int | None = None
        error = why
        try:
            self.kill()
            code = self._inner.wait(KILL_GRACE_S)
        except SandboxError as exc:
            error = f"{why}; {exc}" if why else str(exc)
        self.record(TIMEOUT_EXIT_CODE if timed_out else code, timed_out=timed_out, error=error, killed=True)
        return code

    def finish(self, code: int) -> None:
        """Journal that it exited with ``code``, saying why when we killed it (``kill(why)``) or when
        the sandbox's memory limit did (``out_of_memory`` is then True)."""
        if self._why is not None:
            self.record(code, killed=True, error=self._why)
            return
        if code != 0:  # a failure may follow a memory kill: the count is read again (see read_oom_kills)
            before, after = self._oom_before, self._recorder.read_oom_kills()
            # fewer than before: the sandbox started again since (a new group, counting from 0)
            if (code == KILLED_EXIT_CODE and not self._killed and before is not None and after is not None
                    and after != before and after > 0):
                self.out_of_memory = True
                self.record(code, error=MEMORY_KILL)
                return
        self.record(code)

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
