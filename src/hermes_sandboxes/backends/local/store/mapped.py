"""Store work done as root of a user namespace mapped as a rootless sandbox is.

A rootless sandbox's files are owned by the ids its user namespace maps (``userns.rootless_map``:
inner root is the user, inner 1.. the user's first ``/etc/subuid`` block, as rootless Podman). The
host user cannot read a directory that inner ``_apt`` made 0700, nor delete what inner users own,
nor give a file an inner owner. So copying, removing, walking and
unpacking a rootless layer runs in a user namespace of its own with the same mapping: there, the
process is root over every id the layer can hold, and ownership passes through unchanged.

Root (the root-mode store) needs none of this: every function here runs the work directly then.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import socket
import struct
import subprocess
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from hermes_sandboxes.backends.local import userns
from hermes_sandboxes.backends.local.guest import syscalls as sc
from hermes_sandboxes.errors import SandboxError

T = TypeVar("T")


def needed() -> bool:
    """Whether store work must go through a user namespace (it does unless we are root)."""
    return os.geteuid() != 0


_serving = False  # in the helper process: work may keep state for the helper's later calls (handles.py)


def serving() -> bool:
    """Whether this process is a helper, which outlives the call it runs."""
    return _serving


def started() -> bool:
    """Whether this process has a helper now (a call would not have to start one)."""
    return _helper is not None and _helper.owner == os.getpid()


def _mapped_child(keep: tuple[int, ...]) -> tuple[int, tuple[int, int, int, int]]:
    """Fork a child that enters a new user namespace and waits until this process has mapped it.
    Returns (pid, fds); in the child, returns pid 0 once mapped (the child keeps only ``keep``
    and its own ends: a copy of a descriptor holding a sandbox's flock would hold the lock on)."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            gc.freeze()  # objects of the parent's that wrap a descriptor closed below are never collected
            _close_all_but({*keep, ready_w, go_r})
            sc.unshare(sc.CLONE_NEWUSER)
            os.write(ready_w, b"r")
            if os.read(go_r, 1) != b"g":
                os._exit(1)
        except BaseException:
            os._exit(1)
        return 0, (ready_r, ready_w, go_r, go_w)
    os.close(ready_w)
    os.close(go_r)
    try:
        os.read(ready_r, 1)
        try:
            userns.write_maps(pid, userns.rootless_map())
        except BaseException:
            os.write(go_w, b"x")  # unmapped: the child does nothing
            os.waitpid(pid, 0)
            raise
        os.write(go_w, b"g")
    finally:
        os.close(ready_r)
        os.close(go_w)
    return pid, (ready_r, ready_w, go_r, go_w)


def _close_all_but(keep: set[int]) -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def _send(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(struct.pack("=Q", len(payload)) + payload)


def _receive(sock: socket.socket) -> bytes | None:
    header = _exactly(sock, 8)
    if header is None:
        return None
    return _exactly(sock, struct.unpack("=Q", header)[0])


def _exactly(sock: socket.socket, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(min(size - len(data), 1 << 20))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _answer(fn: Callable[..., Any], args: tuple[Any, ...]) -> bytes:
    try:
        return pickle.dumps((True, fn(*args)))
    except BaseException as exc:
        return pickle.dumps((False, _portable(exc)))


class _Helper:
    """A process kept in a mapped user namespace, which runs this process's store work: mapping a
    namespace costs two setuid helpers (newuidmap, newgidmap) and a fork of this process, more
    than the copy of a small layer. It exits when this process closes its end (or exits)."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid, _ = _mapped_child((theirs.fileno(),))
        if pid == 0:  # pragma: no cover - the helper process
            global _serving
            _serving = True
            code = 0
            try:
                while (request := _receive(theirs)) is not None:
                    fn, args = pickle.loads(request)
                    _send(theirs, _answer(fn, args))
            except BaseException:
                code = 1
            os._exit(code)
        theirs.close()
        self.pid, self.sock = pid, ours
        self.owner = os.getpid()

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> bytes | None:
        try:
            _send(self.sock, pickle.dumps((fn, args)))
            return _receive(self.sock)
        except OSError:
            return None

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


_helper: _Helper | None = None
_helper_lock = threading.Lock()


def call(fn: Callable[..., T], *args: Any, fresh: bool = False) -> T:
    """``fn(*args)`` (a module-level function) as root of a user namespace with this user's
    mapping; directly when we are root. Arguments and result travel by pickle; an exception
    raised inside is raised here. ``fresh``: in a namespace of its own, for work that changes its
    process (unshares a mount namespace, say); else in this process's helper."""
    global _helper
    if not needed():
        return fn(*args)
    if fresh:
        data = _call_fresh(fn, args)
    else:
        with _helper_lock:
            data = None
            for _attempt in (1, 2):  # a helper that died (or belongs to our parent) is replaced once
                if _helper is None or _helper.owner != os.getpid():
                    _helper = _Helper()
                data = _helper.call(fn, args)
                if data is not None:
                    break
                _helper.close()
                _helper = None
    if not data:
        raise SandboxError("store work in a user namespace died before it answered")
    ok, value = pickle.loads(data)
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def _call_fresh(fn: Callable[..., Any], args: tuple[Any, ...]) -> bytes:
    out_r, out_w = os.pipe()
    pid, _ = _mapped_child((out_w,))
    if pid == 0:  # pragma: no cover - the child reports through out_w only
        view = memoryview(_answer(fn, args))
        while view:
            view = view[os.write(out_w, view):]
        os._exit(0)
    os.close(out_w)
    data = bytearray()
    try:
        while chunk := os.read(out_r, 1 << 16):
            data += chunk
    finally:
        os.close(out_r)
        os.waitpid(pid, 0)
    return bytes(data)


def _portable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return SandboxError(f"{type(exc).__name__}: {exc}")


def run(argv: list[str], what: str) -> None:
    """Run ``argv`` as the namespace's root (directly when we are root); SandboxError on failure."""
    call(_run_checked, argv, what)


def _run_checked(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        last = detail[-1] if detail else f"exit {proc.returncode}"
        if len(last) > 400:
            last = f"{last[:150]} ... {last[-150:]}"
        raise SandboxError(f"{what} failed: {last}")
