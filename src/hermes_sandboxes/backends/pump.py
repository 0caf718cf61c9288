"""One way to pump a command's output to its sinks, for every backend.

``PumpedProcess`` is a ``Process`` whose output arrives on a thread of its own (a WebSocket reader, a
streaming RPC, the local init's pipes). It owns the rules the contract promises, so a backend only
says how to run and how to kill:

- each chunk goes straight to its sink and is not kept: memory stays bounded whatever the output;
- a sink that raises stops the command (its ``kill``) and the error comes out of ``wait()``, so a
  closed pipe downstream never leaves the command running unseen;
- ``wait(timeout)`` returns None while the command runs, the exit code when it is done, or raises
  the error that ended the pump (a lost connection, say);
- ``kill()`` works from any thread, from inside a sink included, and is a no-op once it is done.

Subclasses implement ``_run(emit_stdout, emit_stderr) -> int`` (blocking, on the pump thread; it
returns the exit code or raises) and ``_kill()``. ``deliver`` is public for backends that pump on
a thread they already have (the local backend pumps in the waiting thread to save one per exec).
"""

from __future__ import annotations

import contextlib
import threading
from abc import abstractmethod
from collections.abc import Callable

from hermes_sandboxes.errors import SandboxError
from hermes_sandboxes.sandbox import OutputSink, Process

Emit = Callable[[bytes], None]


class SinkGuard:
    """Delivers chunks to the two sinks; the first sink error is kept and triggers ``on_error``."""

    def __init__(self, on_stdout: OutputSink | None, on_stderr: OutputSink | None,
                 on_error: Callable[[], None]) -> None:
        self._sinks: list[OutputSink | None] = [on_stdout, on_stderr]
        self._on_error = on_error
        self.error: BaseException | None = None

    def deliver(self, stream: int, chunk: bytes) -> None:
        """Hand ``chunk`` of ``stream`` (0 stdout, 1 stderr) to its sink; a failing sink is
        dropped, its error kept, and the command stopped."""
        sink = self._sinks[stream]
        if sink is None or not chunk:
            return
        try:
            sink(chunk)
        except Exception as exc:
            self._sinks[stream] = None
            if self.error is None:
                self.error = exc
                self._on_error()

    def stdout(self, chunk: bytes) -> None:
        self.deliver(0, chunk)

    def stderr(self, chunk: bytes) -> None:
        self.deliver(1, chunk)


class PumpedProcess(Process):
    """A Process whose ``_run`` pumps output on a daemon thread started by ``_begin``."""

    def __init__(self, on_stdout: OutputSink | None, on_stderr: OutputSink | None) -> None:
        self._guard = SinkGuard(on_stdout, on_stderr, self._kill_quietly)
        self._done = threading.Event()
        self._returncode: int | None = None
        self._error: BaseException | None = None

    def _begin(self, name: str = "pump") -> None:
        """Start the pump thread; call once the command has been started."""
        threading.Thread(target=self._pump, name=name, daemon=True).start()

    def _pump(self) -> None:
        try:
            self._returncode = self._run(self._guard.stdout, self._guard.stderr)
        except BaseException as exc:
            self._error = exc
        finally:
            self._done.set()

    @abstractmethod
    def _run(self, emit_stdout: Emit, emit_stderr: Emit) -> int:
        """Run until the command ends, emitting its output; return its exit code."""

    @abstractmethod
    def _kill(self) -> None:
        """Kill the command (and, with tree-kill, everything it started)."""

    def _kill_quietly(self) -> None:
        with contextlib.suppress(SandboxError):  # the sink's error is what wait() reports
            self._kill()

    @property
    def returncode(self) -> int | None:
        return self._returncode if self._done.is_set() and self._error is None else None

    def wait(self, timeout: float | None = None) -> int | None:
        if not self._done.wait(timeout):
            return None
        if self._guard.error is not None:
            raise self._guard.error
        if self._error is not None:
            raise self._error
        return self._returncode

    def kill(self) -> None:
        if not self._done.is_set():
            self._kill()
