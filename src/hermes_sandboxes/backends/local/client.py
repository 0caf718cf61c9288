"""Host side of an exec: hand the command to the sandbox's init, stream its output, kill its tree.

The command writes straight into pipes this process owns (their ends travel to the init as
SCM_RIGHTS). Completion is the init's exit message, not end-of-file on the pipes: a background
child that inherited stdout must not make the caller wait forever.
"""

from __future__ import annotations

import _socket
import contextlib
import os
import select
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from hermes_sandboxes.backends.local import cgroups
from hermes_sandboxes.backends.local.guest import protocol
from hermes_sandboxes.backends.pump import SinkGuard
from hermes_sandboxes.errors import ExecFailed, SandboxError
from hermes_sandboxes.sandbox import OutputSink, Process

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from typing import Any, BinaryIO

    from hermes_sandboxes.sandbox import Stdin

_CHUNK = 65536


class Connection(_socket.socket):
    """A unix socket on the C core (see protocol.py), closed at the end of a ``with`` block."""

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(socket_path: str, timeout: float = 5.0) -> Connection:
    sock = Connection(_socket.AF_UNIX, _socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(socket_path)
    except OSError:
        sock.close()
        raise
    return sock


def ping(socket_path: str) -> bool:
    try:
        with connect(socket_path, timeout=2.0) as sock:
            protocol.send(sock, {"op": "ping"})
            reply, _ = protocol.recv(sock)
            return bool(reply.get("ok"))
    except (OSError, EOFError, ValueError, protocol.ProtocolError):
        return False


class LocalProcess(Process):
    """A command running in a local sandbox.

    Output is pumped to the sinks by a background thread (``background=True``, what ``start()``
    gives) or by whichever thread calls ``wait()`` (what ``exec()`` uses: one thread fewer on
    the hot path of every command).
    """

    def __init__(
        self,
        *,
        sandbox: str,
        socket_path: str,
        freezer: Path | None,
        request: Mapping[str, Any],
        stdin: Stdin,
        on_stdout: OutputSink | None,
        on_stderr: OutputSink | None,
        background: bool = True,
        attach: tuple[int, int, int] | None = None,
        exec_id: str | None = None,
    ) -> None:
        self._sandbox = sandbox
        self._returncode: int | None = None
        self._error: ExecFailed | None = None
        self._guard = SinkGuard(on_stdout, on_stderr, self.kill)  # a failing sink stops the command
        self._started = threading.Event()
        self._done = threading.Event()
        self._pump_lock = threading.Lock()
        self._pumping: int | None = None  # the thread pumping now, if any
        self.pid: int | None = None
        self.exec_id = exec_id or os.urandom(8).hex()  # names the command's group (a tag, or random)
        self._group = freezer / f"x{self.exec_id}" if freezer is not None else None
        self._socket_path = socket_path
        if attach is not None:  # the caller's own descriptors (a terminal, say): no pipes of ours
            theirs, ours, in_w = list(attach), {}, -1
        else:
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            piped = stdin is not None and (not isinstance(stdin, bytes) or bool(stdin))
            in_r, in_w = os.pipe() if piped else (os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1)
            theirs, ours = [in_r, out_w, err_w], {out_r: 0, err_r: 1}
        try:
            self._sock = connect(socket_path)
            protocol.send(self._sock, {**request, "op": "exec", "id": self.exec_id}, theirs)
        except OSError as exc:
            for fd in [*ours, in_w]:
                if fd >= 0:
                    os.close(fd)
            raise ExecFailed(f"sandbox {sandbox}: lost contact with its init ({exc}); try again") from exc
        finally:
            if attach is None:
                for fd in theirs:
                    os.close(fd)
        self._sinks: dict[int, int] = ours  # our read end -> stream number (0 stdout, 1 stderr)
        self._poll = select.poll()  # (selectors would cost its import on the hot path of a CLI exec)
        for fd in self._sinks:
            os.set_blocking(fd, False)
            self._poll.register(fd, select.POLLIN)
        self._sock.settimeout(None)
        self._poll.register(self._sock.fileno(), select.POLLIN)
        if in_w >= 0:
            assert stdin is not None
            threading.Thread(target=_feed, args=(in_w, stdin), daemon=True, name=f"stdin-{self.exec_id}").start()
        if background:
            threading.Thread(target=self._pump, daemon=True, name=f"exec-{self.exec_id}").start()

    @property
    def returncode(self) -> int | None:
        return self._returncode

    def _emit(self, fd: int) -> bool:
        """Pass one chunk from ``fd`` to its sink; False at end-of-file or when nothing is there."""
        try:
            chunk = os.read(fd, _CHUNK)
        except (BlockingIOError, InterruptedError):
            return False
        if not chunk:
            return False
        self._guard.deliver(self._sinks[fd], chunk)
        return True

    def _pump(self, deadline: float | None = None) -> None:
        """Move output and messages until the command is done (or ``deadline`` passes)."""
        with self._pump_lock:
            self._pumping = threading.get_ident()
            try:
                self._pump_locked(deadline)
            finally:
                self._pumping = None

    def _pump_locked(self, deadline: float | None) -> None:
        while not self._done.is_set():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            # milliseconds, rounded up (as selectors does): never a busy loop just short of the deadline
            timeout = None if remaining is None else -int(-remaining * 1000 // 1)
            for fd, _ in self._poll.poll(timeout):  # readable, or hung up: a read says which
                if fd not in self._sinks:
                    self._on_message()
                elif not self._emit(fd):
                    self._poll.unregister(fd)
            if self._returncode is not None or self._error is not None:
                self._finish()

    def _finish(self) -> None:
        # The command has exited, so what it wrote is already in the pipes. Drain without waiting
        # for end-of-file, which a background child holding the pipe would postpone forever.
        for fd in self._sinks:
            while self._emit(fd):
                pass
        for fd in self._sinks:
            os.close(fd)
        self._sock.close()
        self._started.set()
        self._done.set()

    def _on_message(self) -> None:
        try:
            message, _ = protocol.recv(self._sock)
        except (EOFError, OSError, protocol.ProtocolError):
            self._error = ExecFailed(
                f"sandbox {self._sandbox} stopped while the command was running "
                "(restored, destroyed or its init was killed)"
            )
            return
        if "started" in message:
            self.pid = int(message["started"])
            self._started.set()
        elif "exit" in message:
            self._returncode = int(message["exit"])
        elif "error" in message:
            self._error = ExecFailed(f"sandbox {self._sandbox}: {message['error']}")

    def wait(self, timeout: float | None = None) -> int | None:
        if not self._done.is_set():
            deadline = None if timeout is None else time.monotonic() + timeout
            if self._pump_lock.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
                self._pump_lock.release()
                self._pump(deadline)  # nobody else is pumping: do it in this thread
            if not self._done.wait(None if deadline is None else max(0.0, deadline - time.monotonic())):
                return None
        if self._error is not None:
            raise self._error
        if self._guard.error is not None:
            raise self._guard.error
        return self._returncode

    def kill(self) -> None:
        if self._done.is_set():
            return
        # the group exists (and holds the command) once init has answered "started"
        if not self._await_started(10.0) or self._done.is_set():
            return
        self._kill_tree()

    def kill_group(self) -> None:
        """Kill everything the command started, also after the command itself has exited: its
        background jobs (an interactive shell's ``sleep 600 &``) live in the same group."""
        if self._await_started(10.0):
            self._kill_tree()

    def _kill_tree(self) -> None:
        """The command's group, or without cgroups its session (the init kills it)."""
        if self._group is not None:
            cgroups.kill_group(self._group)
            return
        with contextlib.suppress(SandboxError):
            cgroups.ask_init(self._socket_path, {"op": "kill", "id": self.exec_id})

    def _await_started(self, timeout: float) -> bool:
        """Wait for init's "started" answer, reading it ourselves when nobody else is pumping or
        when we are called from a sink, i.e. from inside the pump (where waiting would deadlock);
        otherwise the thread that pumps reads it."""
        if self._started.is_set():
            return True
        inside_pump = self._pumping == threading.get_ident()
        if inside_pump or self._pump_lock.acquire(blocking=False):
            try:
                self._sock.settimeout(timeout)
                while not (self._started.is_set() or self._done.is_set() or self._error is not None):
                    self._on_message()  # "started" is always init's first message
            except OSError:
                pass
            finally:
                if not self._done.is_set():
                    self._sock.settimeout(None)
                if not inside_pump:
                    self._pump_lock.release()
        return self._started.wait(timeout)


def _feed(fd: int, source: bytes | BinaryIO) -> None:
    """Write ``source`` into the command's stdin, then close it (its end-of-file). A stream is
    passed on chunk by chunk as the command reads (the pipe's back-pressure paces us), never
    whole; a command that exits early closes the pipe and the rest is left unread."""
    try:
        if isinstance(source, bytes):
            _write_all(fd, source)
            return
        read = getattr(source, "read1", source.read)
        while chunk := read(_CHUNK):
            _write_all(fd, chunk)
    except (OSError, ValueError):  # the command closed its stdin or exited; a closed stream
        pass
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
