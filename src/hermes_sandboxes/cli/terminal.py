"""``shell NAME``: an interactive bash inside a local sandbox, on a real pseudo-terminal.

The contract's ``start()`` has no terminal yet (its stdin is a byte string given up front), so this
speaks the local backend's own protocol: the init runs a command on whatever descriptors the client
sends. We send the slave end of a pty allocated here, put our own terminal in raw mode and copy
bytes both ways, so line editing, colours, full-screen programs and Ctrl-C all work; inside, bash
becomes the session leader of that pty (``setsid --ctty``), which gives it job control.

Why a pty of our own rather than passing our terminal in: a descriptor of the user's terminal in
the sandbox could inject keystrokes into the host shell (TIOCSTI) once the sandbox shell exits. The
pty we allocate only ever feeds the sandbox.

Limitations: local backend only; the window size follows the host terminal (SIGWINCH), but
``tty`` inside names a /dev/pts entry of the host that does not exist inside; when stdin is not a
terminal there is no pty: bash reads a script from stdin (no prompt, no job control).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import select
import selectors
import signal
import socket
import sys
import termios
import threading
import tty
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hermes_sandboxes.backends.local import LocalSandbox, cgroups, client, protocol
from hermes_sandboxes.backends.local.sandbox import BASE_ENV
from hermes_sandboxes.errors import ExecFailed

# bash as the leader of its own session with the pty as controlling terminal (job control); plain
# bash -i where util-linux's setsid is missing; sh where there is no bash (a minimal --base).
INTERACTIVE = ('if command -v bash >/dev/null; then sh=bash; else sh=sh; fi; '
               'if command -v setsid >/dev/null; then exec setsid --wait --ctty "$sh" -i; fi; exec "$sh" -i')
SCRIPTED = 'if command -v bash >/dev/null; then exec bash -s; fi; exec sh -s'
_CHUNK = 65536


def interactive() -> bool:
    """A terminal on both ends: the shell gets a pty; otherwise it reads a script from stdin."""
    return os.isatty(0) and os.isatty(1)


def run_shell(sandbox: LocalSandbox) -> int:
    """Run the shell until it exits; returns its exit code."""
    on_terminal = interactive()
    env = {**BASE_ENV, "HOSTNAME": sandbox.name}
    if on_terminal:
        env["TERM"] = os.environ.get("TERM", "xterm-256color")
        master, slave = os.openpty()
        _copy_window_size(master)
        theirs, ours = [slave, slave, slave], {"in": master, "out": master}
    else:
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        theirs, ours = [in_r, out_w, err_w], {"in": in_w, "out": out_r, "err": err_r}
    exec_id = secrets.token_hex(8)
    request = {"op": "exec", "id": exec_id, "shell": INTERACTIVE if on_terminal else SCRIPTED,
               "cwd": "/root", "env": env}
    try:
        sock, group = _start(sandbox, request, theirs)
    except BaseException:
        for fd in ours.values():
            os.close(fd)
        raise
    finally:
        for fd in set(theirs):
            os.close(fd)
    try:
        with _raw_terminal(on_terminal), _resize_follows(ours["in"] if on_terminal else -1):
            return _Pump(sock, ours, on_terminal, sandbox.name).run()
    finally:
        cgroups.kill_group(group)  # what the shell left running in the background goes with it
        for fd in set(ours.values()):
            if fd != ours["in"] or on_terminal:  # the stdin thread closes a pipe's write end itself
                with contextlib.suppress(OSError):
                    os.close(fd)


def _start(sandbox: LocalSandbox, request: dict[str, Any], fds: list[int]) -> tuple[socket.socket, Path]:
    # The backend's private helpers: existence check and (re)starting the init. See module docstring.
    sandbox._check_exists()
    socket_path, freezer = sandbox._ensure_running()
    try:
        sock = client.connect(socket_path)
        protocol.send(sock, request, fds)
        reply, _ = protocol.recv(sock)
    except (OSError, EOFError, protocol.ProtocolError) as exc:
        raise ExecFailed(f"sandbox {sandbox.name}: lost contact with its init ({exc}); try again") from exc
    if "error" in reply:
        sock.close()
        raise ExecFailed(f"sandbox {sandbox.name}: {reply['error']}")
    return sock, freezer / f"x{request['id']}"


class _Pump:
    """Copies the shell's output to ours until the init reports its exit code; a thread copies our
    stdin to the shell (blocking on either side never stalls the other direction)."""

    def __init__(self, sock: socket.socket, fds: dict[str, int], interactive: bool, name: str) -> None:
        self.sock, self.interactive, self.name = sock, interactive, name
        self.shell_in = fds["in"]
        self.outputs = {fds["out"]: 1, **({fds["err"]: 2} if "err" in fds else {})}
        self.code: int | None = None

    def run(self) -> int:
        threading.Thread(target=self._feed, daemon=True, name="shell-stdin").start()
        sel = selectors.DefaultSelector()
        for fd in self.outputs:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        sel.register(self.sock, selectors.EVENT_READ)
        try:
            while self.code is None:
                for key, _ in sel.select():
                    if key.fileobj is self.sock:
                        self._on_message()
                    elif not self._copy_out(key.fd):
                        sel.unregister(key.fd)
            for fd in self.outputs:  # what the shell wrote just before it exited
                while self._copy_out(fd):
                    pass
        finally:
            sel.close()
            self.sock.close()
        return self.code

    def _on_message(self) -> None:
        try:
            message, _ = protocol.recv(self.sock)
        except (EOFError, OSError, protocol.ProtocolError) as exc:
            raise ExecFailed(f"sandbox {self.name} stopped while the shell was running") from exc
        if "exit" in message:
            self.code = int(message["exit"])

    def _feed(self) -> None:
        """Our stdin to the shell; at end of input the shell's stdin is closed (pipes only: a pty
        has no end of file, Ctrl-D is a byte like any other)."""
        with contextlib.suppress(OSError):
            while data := os.read(0, _CHUNK):
                _write_all(self.shell_in, data)
        if not self.interactive:
            with contextlib.suppress(OSError):
                os.close(self.shell_in)

    def _copy_out(self, fd: int) -> bool:
        try:
            data = os.read(fd, _CHUNK)
        except BlockingIOError:
            return False
        except OSError as exc:  # EIO: every process holding the pty's other end has gone
            if exc.errno == errno.EIO:
                return False
            raise
        if not data:
            return False
        _write_all(self.outputs[fd], data)
        return True


def _write_all(fd: int, data: bytes) -> None:
    """Write everything, waiting when the descriptor is non-blocking and full."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            select.select([], [fd], [])


@contextlib.contextmanager
def _raw_terminal(interactive: bool) -> Iterator[None]:
    """Our terminal passes every key through (the pty inside does the line editing)."""
    if not interactive:
        yield
        return
    saved = termios.tcgetattr(0)
    tty.setraw(0, termios.TCSANOW)  # TCSAFLUSH (the default) would drop what was typed ahead
    try:
        yield
    finally:
        termios.tcsetattr(0, termios.TCSADRAIN, saved)


def _copy_window_size(target: int) -> None:
    with contextlib.suppress(OSError):
        size = fcntl.ioctl(sys.stdout.fileno(), termios.TIOCGWINSZ, b"\0" * 8)
        fcntl.ioctl(target, termios.TIOCSWINSZ, size)


@contextlib.contextmanager
def _resize_follows(master: int) -> Iterator[None]:
    if master < 0:
        yield
        return
    previous = signal.signal(signal.SIGWINCH, lambda *_: _copy_window_size(master))
    try:
        yield
    finally:
        signal.signal(signal.SIGWINCH, previous)
