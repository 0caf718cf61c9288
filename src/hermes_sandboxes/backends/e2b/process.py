"""A command running through envd, its output forwarded chunk by chunk by the shared pump."""

from __future__ import annotations

import contextlib
import signal as signals
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import e2b

from hermes_sandboxes.backends.e2b.faults import map_error
from hermes_sandboxes.backends.pump import Emit, PumpedProcess
from hermes_sandboxes.sandbox import OutputSink, check_tag

if TYPE_CHECKING:
    from hermes_sandboxes.backends.e2b.sandbox import E2BSandbox

GROUP_KILL_TIMEOUT_S = 10.0
TAG_ENV = "HERMES_SANDBOXES_TAG"  # a tagged command's tag, in its environment
_GO_SIGNALS = {"killed": signals.SIGKILL, "terminated": signals.SIGTERM, "interrupt": signals.SIGINT,
               "hangup": signals.SIGHUP, "aborted": signals.SIGABRT, "quit": signals.SIGQUIT,
               "segmentation fault": signals.SIGSEGV, "broken pipe": signals.SIGPIPE}


class E2BProcess(PumpedProcess):
    """A command started through envd. The SDK handle runs with ``retain_output=False``, so each
    chunk passes through to its sink and nothing accumulates on the host."""

    def __init__(self, sandbox: E2BSandbox, handle: Any, on_stdout: OutputSink | None,
                 on_stderr: OutputSink | None) -> None:
        super().__init__(on_stdout, on_stderr)
        self._sandbox = sandbox
        self._handle = handle
        self.pid: int = int(handle.pid)
        self._killed = False
        self._begin(f"e2b-pid{self.pid}")

    def _run(self, emit_stdout: Emit, emit_stderr: Emit) -> int:
        try:
            # The SDK decodes output as UTF-8 (invalid bytes become U+FFFD); it is re-encoded here.
            for stdout, stderr, _ in self._handle:
                if stdout is not None:
                    emit_stdout(stdout.encode("utf-8", "surrogateescape"))
                elif stderr is not None:
                    emit_stderr(stderr.encode("utf-8", "surrogateescape"))
        except Exception as exc:
            if self._killed:  # the stream of a command we killed may end any way it likes
                return 128 + signals.SIGKILL
            self._kill_quietly()  # the stream broke: the command may still be running, stop it
            raise map_error(exc, f"run a command in sandbox {self._sandbox.name}",
                            self._sandbox.backend.redactor) from None
        return self._exit_code()

    def _exit_code(self) -> int:
        try:
            result = self._handle.wait()
        except e2b.CommandExitException as exc:
            code, error = exc.exit_code, exc.error or ""
        else:
            code, error = result.exit_code, result.error or ""
        if code < 0:  # envd (Go) reports a signal death as -1 and "signal: <name>"
            name = error.removeprefix("signal: ").strip()
            return 128 + int(_GO_SIGNALS.get(name, signals.SIGKILL))
        return int(code)

    def _kill(self) -> None:
        self._killed = True
        kill_pid(self._sandbox, self.pid)


def kill_pid(sandbox: E2BSandbox, pid: int) -> None:
    """SIGKILL a command's process group, then its pid.

    The group first, while the pid surely still names the command: recent envd starts every
    non-terminal command as the leader of its own group, so children a shell left behind die
    with it. Where envd does not, no such group exists and only the command itself is killed
    (so the backend does not claim tree-kill)."""
    sdk = sandbox.sdk
    with contextlib.suppress(Exception):  # the pid kill below still runs; its failure is reported
        sdk.commands.run(f"kill -KILL -- -{pid} 2>/dev/null; true", timeout=GROUP_KILL_TIMEOUT_S)
    sandbox.call("kill a command", lambda: sdk.commands.kill(pid))


def tagged(env: Mapping[str, str] | None, tag: str | None) -> dict[str, str]:
    """``env`` with the command's tag (``Sandbox.kill_tagged``) in ``TAG_ENV``, where envd lists it
    for every running command (the SDK's ``commands.run`` cannot pass envd's own tag field)."""
    if tag is None:
        return dict(env or {})
    return {**(env or {}), TAG_ENV: check_tag(tag)}
