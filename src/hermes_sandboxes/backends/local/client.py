"""Host side of an exec: hand the command to the sandbox's init, stream its output, kill its tree.

The command writes straight into pipes this process owns (their ends travel to the init as
SCM_RIGHTS). Completion is the init's exit message, not end-of-file on the pipes: a background
child that inherited stdout must not make the caller wait forever.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import selectors
import socket
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hermes_sandboxes.backends.local import cgroups, protocol
from hermes_sandboxes.errors import ExecFailed
from hermes_sandboxes.sandbox import OutputSink, Process

_CHUNK = 65536


def connect(socket_path: str, timeout: float = 5.0) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
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
    def __init__(
        self,
        *,
        sandbox: str,
        socket_path: str,
        freezer: Path,
        request: Mapping[str, Any],
        stdin: bytes | None,
        on_stdout: OutputSink | None,
        on_stderr: OutputSink | None,
    ) -> None:
        self._sandbox = sandbox
        self._sinks: dict[int, OutputSink | None] = {}
        self._returncode: int | None = None
        self._error: ExecFailed | None = None
        self._done = threading.Event()
        self.exec_id = secrets.token_hex(8)
        self._group = freezer / f"x{self.exec_id}"
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if stdin else (os.open(os.devnull, os.O_RDONLY), -1)
        try:
            self._sock = connect(socket_path)
            protocol.send(self._sock, {**request, "op": "exec", "id": self.exec_id}, [in_r, out_w, err_w])
            reply, _ = protocol.recv(self._sock)
        except (OSError, EOFError, protocol.ProtocolError) as exc:
            for fd in (out_r, err_r, in_w):
                if fd >= 0:
                    os.close(fd)
            raise ExecFailed(f"sandbox {sandbox}: lost contact with its init ({exc}); try again") from exc
        finally:
            for fd in (in_r, out_w, err_w):
                os.close(fd)
        if "error" in reply:
            os.close(out_r)
            os.close(err_r)
            if in_w >= 0:
                os.close(in_w)
            raise ExecFailed(f"sandbox {sandbox}: {reply['error']}")
        self.pid = int(reply["started"])
        self._sinks = {out_r: on_stdout, err_r: on_stderr}
        if in_w >= 0:
            threading.Thread(target=_feed, args=(in_w, stdin or b""), daemon=True).start()
        self._thread = threading.Thread(target=self._pump, daemon=True, name=f"exec-{self.exec_id}")
        self._thread.start()

    @property
    def returncode(self) -> int | None:
        return self._returncode

    def _emit(self, fd: int) -> bool:
        try:
            chunk = os.read(fd, _CHUNK)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        sink = self._sinks[fd]
        if sink is not None:
            sink(chunk)
        return True

    def _pump(self) -> None:
        sel = selectors.DefaultSelector()
        for fd in self._sinks:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        self._sock.settimeout(None)
        sel.register(self._sock, selectors.EVENT_READ)
        try:
            while self._returncode is None and self._error is None:
                for key, _ in sel.select():
                    if key.fileobj is self._sock:
                        self._on_message()
                    elif not self._emit(key.fd):  # type: ignore[arg-type]
                        sel.unregister(key.fd)
            # The command has exited: what it wrote is already in the pipes. Drain without waiting
            # for end-of-file, which a background child holding the pipe would postpone forever.
            for fd in self._sinks:
                while self._emit_nonblocking(fd):
                    pass
        finally:
            sel.close()
            for fd in self._sinks:
                os.close(fd)
            self._sock.close()
            self._done.set()

    def _emit_nonblocking(self, fd: int) -> bool:
        try:
            chunk = os.read(fd, _CHUNK)
        except (BlockingIOError, OSError):
            return False
        if not chunk:
            return False
        sink = self._sinks[fd]
        if sink is not None:
            sink(chunk)
        return True

    def _on_message(self) -> None:
        try:
            message, _ = protocol.recv(self._sock)
        except (EOFError, OSError, protocol.ProtocolError):
            self._error = ExecFailed(
                f"sandbox {self._sandbox} stopped while the command was running "
                "(restored, destroyed or its init was killed)"
            )
            return
        if "exit" in message:
            self._returncode = int(message["exit"])

    def wait(self, timeout: float | None = None) -> int | None:
        if not self._done.wait(timeout):
            return None
        if self._error is not None:
            raise self._error
        return self._returncode

    def kill(self) -> None:
        cgroups.kill_group(self._group)


def _feed(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    os.close(fd)
