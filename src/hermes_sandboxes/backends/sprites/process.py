"""A command running in a Sprite: its exec WebSocket pumped on a thread, killed through the API.

Kill: ``POST /v1/sprites/{name}/exec/{session}/kill`` (the SDK's ``sprites.session.kill_session``)
with SIGTERM and a short grace after which the service kills outright; the Sprite itself lives on.
The session id comes in the first text frame; a kill asked for before it arrived is sent as soon
as it does. A connection lost mid-command is an error naming the Sprite, never a silent re-run;
the orphaned session (the service keeps it a few seconds) is killed on the way out.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import select
import struct
import termios
import threading
import tty
from typing import TYPE_CHECKING, Any

from sprites.session import kill_session
from websockets.exceptions import ConnectionClosed

from hermes_sandboxes.backends.pump import Emit, PumpedProcess
from hermes_sandboxes.backends.sprites.wire import ExecSocket, Lost
from hermes_sandboxes.errors import SandboxError, SandboxUnreachable
from hermes_sandboxes.sandbox import OutputSink, Stdin

if TYPE_CHECKING:
    from hermes_sandboxes.backends.sprites.sandbox import SpritesSandbox

log = logging.getLogger(__name__)
KILL_SIGNAL = "SIGTERM"
KILL_GRACE_S = 3  # the service sends SIGKILL this long after SIGTERM


class SpritesProcess(PumpedProcess):
    def __init__(self, sandbox: SpritesSandbox, socket: ExecSocket, stdin: Stdin,
                 on_stdout: OutputSink | None, on_stderr: OutputSink | None) -> None:
        super().__init__(on_stdout, on_stderr)
        self._sandbox = sandbox
        self._socket = socket
        self._stdin = stdin
        self._lock = threading.Lock()
        self._kill_wanted = False
        self._killed_session: str | None = None
        socket.on_session = self._on_session
        self._begin(f"sprites-exec-{sandbox.name}")

    @property
    def session_id(self) -> str | None:
        return self._socket.session_id

    def _run(self, emit_stdout: Emit, emit_stderr: Emit) -> int:
        try:
            if self._stdin is None or isinstance(self._stdin, bytes):
                self._socket.send_stdin(self._stdin)
            else:  # a stream: fed beside the pump, so output flows while it is read
                threading.Thread(target=self._socket.send_stdin_stream, args=(self._stdin,), daemon=True,
                                 name=f"sprites-stdin-{self._sandbox.name}").start()
            self._stdin = None
            return self._socket.pump(emit_stdout, emit_stderr)
        except Lost as exc:
            self._kill_orphan()
            raise SandboxUnreachable(
                f"Sprite {self._sandbox.name}: {exc}. The command was not re-run; it may have run in part, "
                "so check its effects before running it again") from None

    def _on_session(self, session_id: str) -> None:
        with self._lock:
            wanted = self._kill_wanted
        if wanted:
            self._send_kill(session_id)

    def _kill(self) -> None:
        with self._lock:
            self._kill_wanted = True
            session_id = self._socket.session_id
        if session_id is not None:
            self._send_kill(session_id)

    def _send_kill(self, session_id: str) -> None:
        with self._lock:
            if self._killed_session == session_id:
                return
            self._killed_session = session_id
        sandbox = self._sandbox
        messages = sandbox.backend.api.call(
            f"kill of exec session {session_id}",
            lambda: list(kill_session(sandbox.sdk_sprite, session_id, signal=KILL_SIGNAL, timeout=KILL_GRACE_S)),
            sprite=sandbox.name)
        for message in messages:
            if message.type == "error":
                log.warning("sprites: kill of session %s in %s: %s", session_id, sandbox.name,
                            sandbox.backend.api.redact(str(message.error or message.data)))

    def _kill_orphan(self) -> None:
        session_id = self._socket.session_id
        if session_id is None:
            return
        with contextlib.suppress(SandboxError):
            self._send_kill(session_id)


class TerminalProcess(SpritesProcess):
    """A command on a terminal (the exec WebSocket's TTY mode) whose input is read from the
    caller's descriptor ``fds[0]`` and whose output (stdout and stderr merged, as on any terminal)
    is written to ``fds[1]``. The descriptors are duplicated, so the caller may close its own as
    soon as ``attach`` returns (as with the local backend, which hands them to the sandbox). A
    terminal there is put in raw mode while the command runs: the remote terminal does the echo
    and line editing, as ssh does; its size follows the local one."""

    def __init__(self, sandbox: SpritesSandbox, socket: ExecSocket, fds: tuple[int, int, int]) -> None:
        self._in_fd, self._out_fd = os.dup(fds[0]), os.dup(fds[1])
        self._saved = _raw(self._in_fd)
        self._size = terminal_size(self._out_fd)
        super().__init__(sandbox, socket, None, self._write_out, None)
        threading.Thread(target=self._copy_in, name=f"sprites-tty-{sandbox.name}", daemon=True).start()

    def _write_out(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        while view:
            view = view[os.write(self._out_fd, view):]

    def _copy_in(self) -> None:
        """Typed input (and window size changes) to the command until it is done."""
        try:
            with contextlib.suppress(OSError, ConnectionClosed):
                while self.poll() is None:
                    self._follow_size()
                    ready, _, _ = select.select([self._in_fd], [], [], 0.2)
                    if not ready:
                        continue
                    data = os.read(self._in_fd, 4096)
                    if not data:
                        break
                    self._socket.send_raw(data)
            with contextlib.suppress(Exception):  # its outcome is wait()'s business
                self.wait()
        finally:
            if self._saved is not None:
                with contextlib.suppress(termios.error):
                    termios.tcsetattr(self._in_fd, termios.TCSADRAIN, self._saved)
            os.close(self._in_fd)
            os.close(self._out_fd)

    def _follow_size(self) -> None:
        size = terminal_size(self._out_fd)
        if size != self._size:
            self._size = size
            self._socket.resize(*size)


def _raw(fd: int) -> list[Any] | None:
    """Put the terminal on ``fd`` in raw mode; its previous attributes (None: not a terminal)."""
    if not os.isatty(fd):
        return None
    saved = termios.tcgetattr(fd)
    tty.setraw(fd, termios.TCSANOW)
    return saved


def terminal_size(fd: int) -> tuple[int, int]:
    """(rows, cols) of the terminal on ``fd``; 24x80 when it is not a terminal."""
    try:
        rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    except OSError:
        return 24, 80
    return (rows or 24), (cols or 80)
