"""``shell NAME``: an interactive bash inside a local sandbox, on a real pseudo-terminal.

The contract's ``start()`` has no terminal (its stdin is a byte string given up front), so this uses
the local sandbox's ``attach()``, which runs a command on descriptors we hand it: the slave end of a
pty the sandbox allocates in its own devpts (so ``tty`` inside names it). We put our own terminal in
raw mode and copy bytes both ways, so line editing, colours, full-screen programs and Ctrl-C all
work; inside, bash becomes the session leader of that pty (``setsid --ctty``), which gives it job
control.

Why a pty of our own rather than passing our terminal in: a descriptor of the user's terminal in
the sandbox could inject keystrokes into the host shell (TIOCSTI) once the sandbox shell exits. The
pty we allocate only ever feeds the sandbox.

When the shell exits, what it left running in the background stays, as after ``exit`` in a real
terminal (bash ends stopped jobs, and warns first). When our own terminal hangs up (a closed window,
a dropped ssh: SIGHUP), the shell's pty is hung up too, as a real terminal's would be: bash passes
SIGHUP to its jobs and exits, while ``nohup``, ``setsid`` and disowned jobs survive; the CLI exits 129.

The window size follows the host terminal: it is copied at the start and again on each SIGWINCH.

Limitations: backends with ``Capability.TERMINAL`` only; when stdin is not a terminal there is no
pty: bash reads a script from stdin (no prompt, no job control).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import selectors
import signal
import sys
import termios
import threading
import tty
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from hermes_sandboxes.sandbox import Process, Sandbox


class Attach(Protocol):
    """What starts the shell: ``Sandbox.attach``'s signature."""

    def __call__(self, command: str, fds: tuple[int, int, int], *, cwd: str | None = None,
                 env: dict[str, str] | None = None) -> Process: ...


# bash as the leader of its own session with the pty as controlling terminal (job control). The
# command starts as a session leader; with a pty of the sandbox's own devpts it already has that pty
# as its controlling terminal (seen on Linux 6.x), and a second session could not take it, so bash
# runs in place; otherwise (a host pty) util-linux's setsid gives it one. Plain bash -i where setsid
# is missing; sh where there is no bash (a minimal --base).
INTERACTIVE = ('if command -v bash >/dev/null; then sh=bash; else sh=sh; fi; '
               'if ! { : </dev/tty; } 2>/dev/null && command -v setsid >/dev/null; then '
               'exec setsid --wait --ctty "$sh" -i; fi; exec "$sh" -i')
SCRIPTED = 'if command -v bash >/dev/null; then exec bash -s; fi; exec sh -s'
_CHUNK = 65536
_WAIT_SLICE_S = 0.25
_HANG_UP_WAIT_S = 10.0  # for bash to pass SIGHUP on to its jobs and exit, after its pty hung up


def interactive() -> bool:
    """A terminal on both ends: the shell gets a pty; otherwise it reads a script from stdin."""
    return os.isatty(0) and os.isatty(1)


@dataclass(frozen=True)
class _Ends:
    """The descriptors between us and the shell: a pty (one master for everything) or three pipes."""

    theirs: tuple[int, int, int]  # the shell's stdin, stdout and stderr
    shell_in: int  # where our stdin goes
    outputs: dict[int, int]  # the shell's output, read here -> our descriptor it is copied to
    terminal: bool

    @classmethod
    def open(cls, sandbox: Sandbox, terminal: bool) -> _Ends:
        if terminal:
            master, slave = sandbox.open_terminal()
            _copy_window_size(master)
            return cls((slave, slave, slave), master, {master: 1}, terminal)
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        return cls((in_r, out_w, err_w), in_w, {out_r: 1, err_r: 2}, terminal)

    def close_theirs(self) -> None:
        for fd in set(self.theirs):
            os.close(fd)

    def close_ours(self, *, fed: bool) -> None:
        """``fed``: the stdin thread runs, and closes a pipe's write end itself at end of input."""
        keep = {self.shell_in} if fed and not self.terminal else set()
        for fd in {self.shell_in, *self.outputs} - keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def run_shell(sandbox: Sandbox, attach: Attach | None = None) -> int:
    """Run the shell until it exits; returns its exit code. ``attach`` starts it (default:
    ``sandbox.attach``; the CLI's records it, written ahead)."""
    ends = _Ends.open(sandbox, interactive())
    env = {"TERM": os.environ.get("TERM", "xterm-256color")} if ends.terminal else None
    attach = attach or sandbox.attach
    try:
        proc = attach(INTERACTIVE if ends.terminal else SCRIPTED, ends.theirs, cwd=sandbox.home, env=env)
    except BaseException:
        ends.close_ours(fed=False)
        raise
    finally:
        ends.close_theirs()
    try:
        with _raw_terminal(ends.terminal), _resize_follows(ends.shell_in if ends.terminal else -1):
            threading.Thread(target=_feed, args=(ends.shell_in, not ends.terminal), daemon=True,
                             name="shell-stdin").start()
            with _copying(ends.outputs, on_error=proc.kill):
                try:
                    code = _wait(proc)
                except KeyboardInterrupt as exc:
                    if ends.terminal and getattr(exc, "signum", None) == signal.SIGHUP:
                        _hang_up(ends.shell_in, proc)
                    raise
                finally:
                    proc.kill()  # only if wait() failed: what the shell started in the background lives
                    # on, as after closing a real terminal (nohup, setsid and disowned jobs survive)
        return code
    finally:
        ends.close_ours(fed=True)


def _wait(proc: Process) -> int:
    """The shell's exit code, waited for in short slices: the kernel may hand a signal (SIGWINCH,
    SIGTERM) to one of our copying threads, and Python runs its handler only when the main thread
    comes back from the wait (a wait without end would sit on a resize until the shell exits)."""
    while (code := proc.wait(_WAIT_SLICE_S)) is None:
        pass
    return code


def _hang_up(master: int, proc: Process) -> None:
    """Our terminal went away (SIGHUP): hang up the shell's pty too, as a closed terminal window does.
    bash gets SIGHUP and passes it to its jobs, then exits; ``nohup``, ``setsid`` and disowned jobs
    live on. Killing the shell's process tree instead would take those with it. A shell that has
    not gone after a while is killed (the caller's ``kill()``)."""
    # a second SIGHUP (the terminal's hang-up reaches a session leader and a foreground group, and
    # we may be both) must not cut the wait short: the kill after it would take every job
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:  # closes the master (the kernel then hangs the pty up) and leaves its number valid for clean-up
        os.dup2(null, master)
    finally:
        os.close(null)
    with contextlib.suppress(Exception):
        proc.wait(_HANG_UP_WAIT_S)


def _feed(shell_in: int, close_at_end: bool) -> None:
    """Our stdin to the shell; at end of input the shell's stdin is closed (pipes only: a pty has no
    end of file, Ctrl-D is a byte like any other)."""
    with contextlib.suppress(OSError):
        while data := os.read(0, _CHUNK):
            _write_all(shell_in, data)
    if close_at_end:
        with contextlib.suppress(OSError):
            os.close(shell_in)


@contextlib.contextmanager
def _copying(outputs: dict[int, int], on_error: Callable[[], None]) -> Iterator[None]:
    """Copy the shell's output to ours on a thread while the block runs (the block waits for the
    shell); at its end, copy what is already written and stop, without waiting for an end of file
    that a background job holding the pty or pipe would postpone forever. A failure to copy (our
    stdout closed, say) calls ``on_error`` (which kills the shell) and is raised after the block;
    but not our terminal hanging up (EIO), which the SIGHUP that comes with it handles."""
    stop_r, stop_w = os.pipe()
    failed: list[BaseException] = []

    def copy() -> None:
        try:
            _copy_until(stop_r, outputs)
        except OSError as exc:
            if exc.errno != errno.EIO:
                failed.append(exc)
                with contextlib.suppress(Exception):
                    on_error()
            # EIO: our terminal hung up; its SIGHUP ends the shell as a hang-up, never a kill of all
        except BaseException as exc:
            failed.append(exc)
            with contextlib.suppress(Exception):
                on_error()

    thread = threading.Thread(target=copy, daemon=True, name="shell-output")
    thread.start()
    try:
        yield
    finally:
        os.write(stop_w, b"\0")
        thread.join()
        os.close(stop_r)
        os.close(stop_w)
    if failed:
        raise failed[0]


def _copy_until(stop: int, outputs: dict[int, int]) -> None:
    with selectors.DefaultSelector() as sel:
        for fd in outputs:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        sel.register(stop, selectors.EVENT_READ)
        while True:
            for key, _ in sel.select():
                if key.fd == stop:
                    for fd, target in outputs.items():  # what the shell wrote before it exited
                        while _copy_out(fd, target):
                            pass
                    return
                if _copy_out(key.fd, outputs[key.fd]) is None:
                    sel.unregister(key.fd)


def _copy_out(fd: int, target: int) -> bool | None:
    """Copy one chunk; False when there is nothing to read now, None when nothing more will come."""
    try:
        data = os.read(fd, _CHUNK)
    except BlockingIOError:
        return False
    except OSError as exc:  # EIO: every process holding the pty's other end has gone
        if exc.errno == errno.EIO:
            return None
        raise
    if not data:
        return None
    _write_all(target, data)
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
        with contextlib.suppress(termios.error):  # EIO: the terminal has gone (hung up), nothing to restore
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
    _copy_window_size(master)  # a resize since the pty was opened had no handler yet (the same size: no signal)
    try:
        yield
    finally:
        signal.signal(signal.SIGWINCH, previous)
