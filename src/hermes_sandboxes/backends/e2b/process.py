"""A command running through envd, its output forwarded chunk by chunk on a thread."""

from __future__ import annotations

import contextlib
import signal as signals
import threading
from typing import TYPE_CHECKING, Any

import e2b

from hermes_sandboxes.backends.e2b.faults import map_error
from hermes_sandboxes.errors import SandboxError
from hermes_sandboxes.sandbox import (
    OutputSink,
    Process,
)

if TYPE_CHECKING:
    from hermes_sandboxes.backends.e2b.sandbox import E2BSandbox

KILL_GRACE_S = 10.0  # after a kill, how long a command's stream may take to end before we give up on it
_GO_SIGNALS = {"killed": signals.SIGKILL, "terminated": signals.SIGTERM, "interrupt": signals.SIGINT,
               "hangup": signals.SIGHUP, "aborted": signals.SIGABRT, "quit": signals.SIGQUIT,
               "segmentation fault": signals.SIGSEGV, "broken pipe": signals.SIGPIPE}


class E2BProcess(Process):
    """A command started through envd; a thread forwards its output chunk by chunk."""

    def __init__(self, sandbox: E2BSandbox, handle: Any, on_stdout: OutputSink | None,
                 on_stderr: OutputSink | None) -> None:
        self._sandbox = sandbox
        self._handle = handle
        self.pid: int = int(handle.pid)
        self._sinks = (on_stdout, on_stderr)
        self._returncode: int | None = None
        self._error: BaseException | None = None  # the stream's
        self._sink_error: BaseException | None = None
        self._killed = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run_pump, name=f"e2b-pid{self.pid}", daemon=True)
        self._thread.start()

    @property
    def returncode(self) -> int | None:
        return self._returncode if self._done.is_set() else None

    def _pump(self) -> None:
        try:
            for stdout, stderr, _ in self._handle:
                if not self._deliver(stdout, stderr):
                    break
            else:
                self._returncode = self._exit_code()
                return
        except BaseException as exc:
            if self._killed:
                self._returncode = 128 + signals.SIGKILL
                return
            self._error = exc  # the stream broke: the command may still run, stop it
        with contextlib.suppress(Exception):
            self._sandbox._sdk.commands.kill(self.pid)
            self._handle.disconnect()

    def _deliver(self, stdout: str | None, stderr: str | None) -> bool:
        """Hand one chunk to its sink; a sink that raises stops the command and wait() raises it."""
        out, err = self._sinks
        try:
            if stdout is not None and out is not None:
                out(stdout.encode("utf-8", "surrogateescape"))
            elif stderr is not None and err is not None:
                err(stderr.encode("utf-8", "surrogateescape"))
        except BaseException as exc:
            self._sink_error = exc
            return False
        return True

    def _run_pump(self) -> None:
        try:
            self._pump()
        finally:
            self._done.set()

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

    def wait(self, timeout: float | None = None) -> int | None:
        if not self._done.wait(timeout):
            return None
        if self._sink_error is not None:
            raise self._sink_error  # as the sink raised it
        if self._error is not None:
            if isinstance(self._error, SandboxError):
                raise self._error
            raise map_error(self._error, f"run a command in sandbox {self._sandbox.name}",
                            self._sandbox.backend._redactor) from None
        return self._returncode

    def kill(self) -> None:
        """SIGKILL the command by pid; if its stream does not end in time, let go of it.

        First, while the pid surely still names the command, its process group gets SIGKILL too:
        recent envd starts every non-terminal command as the leader of its own group, so children
        a shell left behind die with it. Where envd does not, that group does not exist and only
        the command itself is killed (so the backend does not claim tree-kill)."""
        if self._done.is_set():
            return
        self._killed = True
        sdk = self._sandbox._sdk
        with contextlib.suppress(Exception):
            sdk.commands.run(f"kill -KILL -- -{self.pid} 2>/dev/null; true", timeout=KILL_GRACE_S)
        with contextlib.suppress(SandboxError):
            self._sandbox._call("kill a command", lambda: sdk.commands.kill(self.pid))
        if not self._done.wait(KILL_GRACE_S):
            with contextlib.suppress(Exception):
                self._handle.disconnect()
            self._done.wait(KILL_GRACE_S)
