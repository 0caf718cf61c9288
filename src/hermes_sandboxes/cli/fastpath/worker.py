"""One warm exec call, in the worker the server forked for it: become the client's CLI, run, answer.

The request (warm.py) carries the client's argv, environment (bytes), umask, ignored signals and
``sys.path``. The worker checks the stamp (same interpreter, package, flags and start-up variables
as the server), answers its pid, and waits for the client's go, which comes with its stdin, stdout,
stderr and working directory as descriptors (a client that gave up waiting has gone, and nothing
must run). Then
it takes on everything a fresh interpreter would have had: the descriptors on 0, 1 and 2, the
working directory, umask, environment (and time zone), argv, ``sys.path``, the ignored signals, and
``sys.stdin``/``stdout``/``stderr`` built over the new descriptors as the interpreter builds them
(same encoding and errors, line buffering on a terminal and for stderr). It runs
``fast.try_exec`` as the CLI's ``main`` would, and the click application when that declines; ends as
the interpreter ends (non-daemon threads, atexit, the final flush: 120 when stdout cannot be
flushed), lets go of the client's stdio, and answers the exit code, or 'fall back' for what must run
in-process (``shell``).

While the command runs, a thread watches the connection: if it closes, the client is gone (kill
-9), and the worker's main thread gets a real SIGHUP, so the command is stopped and recorded as
interrupted exactly as when a terminal closes on the in-process CLI. SIGINT, SIGTERM and SIGHUP
route through cli/signals.py from the worker's first moment (the client forwards them as soon as
it knows our pid).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import marshal
import os
import signal
import socket
import sys
import threading
import time

from hermes_sandboxes.cli import signals
from hermes_sandboxes.cli.fastpath import warm
from hermes_sandboxes.util import failpoints

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn

_GO_DEADLINE_S = 30.0  # the client sends it as soon as it reads our pid
_MAX_REQUEST = 64 << 20


class _Server:
    pid = 0  # the server that forked us


def serve(conn: socket.socket, stamped: tuple[Any, ...], stale: Callable[[], bool], server: int) -> NoReturn:
    """Serve ``conn`` and exit; ``stale()`` says whether the server's code changed on disk."""
    _Server.pid = server
    signals.install()  # kept for the whole call: a forwarded signal always unwinds like Ctrl-C
    try:
        _serve(conn, stamped, stale)
    except BaseException:  # nothing may escape a forked child; the client reports a lost worker
        pass
    finally:
        os._exit(0)


def _serve(conn: socket.socket, stamped: tuple[Any, ...], stale: Callable[[], bool]) -> None:
    conn.settimeout(_GO_DEADLINE_S)
    request = _receive(conn)  # (read whole before any answer: a socket closed unread resets)
    if request is None:
        return
    if stale():
        conn.sendall(b"stale\n")
        server = os.getppid()
        if server == _Server.pid:  # (still our parent: never signal whoever inherited us)
            os.kill(server, signal.SIGTERM)  # the server goes; the client starts a new one
        return
    if not isinstance(request, tuple) or len(request) != 7 or request[0] != stamped:
        conn.sendall(b"fallback\n")
        return
    conn.sendall(f"pid {os.getpid()}\n".encode())
    go, fds, _flags, _addr = socket.recv_fds(conn, 1, 8)  # the client is still there, with its descriptors
    if go != b"g" or len(fds) != 4:
        for fd in fds:
            os.close(fd)
        return  # the client gave up on us: it runs the command itself
    conn.settimeout(None)
    _, argv, args, env, umask, ignored, path = request
    _become(fds, env, umask, ignored, argv, path)
    done = threading.Event()
    _watch(conn, done)
    code = _run(args)
    if code is None:
        done.set()
        conn.sendall(b"fallback\n")
        return
    code = _end(code)
    _let_go_of_stdio()
    done.set()
    conn.sendall(f"exit {code}\n".encode())
    failpoints.pause("warm-answered")


def _receive(conn: socket.socket) -> Any:
    """The request (None if the client went away or sent nonsense)."""
    try:
        size = int.from_bytes(_exactly(conn, 4), "big")
        if size > _MAX_REQUEST:
            raise ValueError("request too large")
        return marshal.loads(_exactly(conn, size))
    except (OSError, ValueError, EOFError, TypeError):
        return None


def _exactly(conn: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("the client went away")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _become(fds: list[int], env: dict[bytes, bytes], umask: int, ignored: list[int], argv: list[str],
            path: list[str]) -> None:
    """Take on the client's process state, as a fresh interpreter started by it would have it."""
    for target, fd in zip((0, 1, 2), fds[:3], strict=True):
        os.dup2(fd, target)
    os.fchdir(fds[3])
    for fd in fds:
        os.close(fd)
    os.umask(umask)
    current = os.environb  # (changed only where it differs: ~1 ms less than clear() and update())
    for var in [var for var in current if var not in env]:
        del current[var]
    for var, value in env.items():
        if current.get(var) != value:
            current[var] = value
    time.tzset()
    sys.argv[:] = argv
    sys.path[:] = path
    for signum in ignored:
        if signum not in signals.SIGNALS:  # (those unwind like Ctrl-C, as the in-process CLI makes them)
            with contextlib.suppress(OSError, ValueError):
                signal.signal(signum, signal.SIG_IGN)
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        stream = _stream(fd, getattr(sys, f"__{name}__"), f"<{name}>")
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _stream(fd: int, like: Any, name: str) -> Any:
    """``sys.stdin``/``stdout``/``stderr`` over ``fd`` as the interpreter creates them at start-up
    (``like``, our own, was created so with the same settings: encoding, errors, -u)."""
    write = fd != 0
    unbuffered = bool(write and like.write_through)
    buffer: Any = open(fd, "wb" if write else "rb", 0 if unbuffered else -1, closefd=False)  # noqa: SIM115
    raw: Any = buffer if unbuffered else buffer.raw
    raw.name = name
    line_buffering = not unbuffered and (os.isatty(fd) or fd == 2)
    stream = io.TextIOWrapper(buffer, encoding=like.encoding, errors=like.errors, newline="\n",
                              line_buffering=line_buffering, write_through=unbuffered)
    stream.mode = "w" if write else "r"  # type: ignore[misc]
    return stream


def _watch(conn: socket.socket, done: threading.Event) -> None:
    """A thread that turns the client's disappearance into a SIGHUP for our main thread."""
    main = threading.main_thread().ident
    assert main is not None

    def watch() -> None:
        while True:
            try:
                data = conn.recv(64)
            except OSError:
                data = b""
            if not data:
                break
        if not done.is_set():
            signal.pthread_kill(main, signal.SIGHUP)

    # with every signal blocked (inherited from this thread's mask, so from its first instruction):
    # a signal sent to the worker (the client forwards Ctrl-C as SIGINT) must reach the main thread.
    # Delivered to this one, Python's handler would only be run by the main thread once its blocking
    # read (a prompt reading the terminal) returned: a Ctrl-C at a warm prompt was lost so, on a
    # loaded machine, where the kernel picked this thread more often
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        threading.Thread(target=watch, name="hermes-sandboxes-warm-client", daemon=True).start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _run(args: list[str]) -> int | None:
    """What ``cli.main`` does with ``args`` on the fast path: its exit code, or None."""
    from hermes_sandboxes.cli.fastpath import inprocess as fast
    from hermes_sandboxes.ui.text import error

    try:
        code = fast.try_exec(args)
        if code is not None or not warm.served_warm(args):
            return code
        from hermes_sandboxes.cli.app import cli

        cli.main(args=args, prog_name="hermes-sandboxes")  # (it ends in SystemExit with the code)
        return 0
    except KeyboardInterrupt as exc:
        name = signals.name(exc)
        error("interrupted" if name == "SIGINT" else f"interrupted by {name}")
        return signals.exit_code(exc)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        with contextlib.suppress(OSError, ValueError):
            print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        import traceback

        with contextlib.suppress(OSError, ValueError):
            traceback.print_exc()
        return 1


def _let_go_of_stdio() -> None:
    """Point 0, 1 and 2 at /dev/null once everything is flushed: the client's pipes end when the
    client does, not once this process is gone (a process's descriptors close only after its
    address space is torn down, ~1 ms for a fork of the server, which keeps every command's modules:
    whoever reads the client's output waited for that)."""
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)


def _end(code: int) -> int:
    """As the interpreter ends: wait for non-daemon threads, run atexit, flush stdout and stderr."""
    with contextlib.suppress(Exception):
        getattr(threading, "_shutdown")()  # noqa: B009 - what Py_Finalize calls first
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
    except (OSError, ValueError) as exc:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"Exception ignored in: {sys.stdout!r}\n{type(exc).__name__}: {exc}\n")
        code = 120
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        code = 120
    return code
