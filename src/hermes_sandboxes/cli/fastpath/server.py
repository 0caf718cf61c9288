"""The warm server: one process per user and key that keeps the CLI imported (the ``exec`` fast
path and the click application) and forks a worker (worker.py) per call, the zygote pattern (as
dmypy or nailgun do).

Started in the background by a client that found no server (warm.py), in its own session, on
/dev/null, with no inherited descriptor, in ``/``. It exits at once if another server holds the
key's lock (two clients that start one at the same moment leave one server), and otherwise:

- remembers the size and mtime of the interpreter and of every module file of the package, those it
  does not import too (a worker may: a command's module imported when it runs), before it imports
  any (a file changed while it imports is one it may have loaded old or new: stale at once), then
  imports the modules the commands run with (``PRELOAD``) and runs ``WARM_UP``;
- listens on ``<runtime dir>/<key>.sock`` and writes its pid to ``<key>.pid``;
- per connection: the peer must be our own uid (SO_PEERCRED); it hands the connection to its spare
  worker (forked ahead in a quiet moment, waiting on a socket pair) or forks one, and goes back to
  listening. The worker reads the request, and if any remembered file changed it answers 'stale'
  (the client runs in-process and starts a new server) and tells us to go (SIGTERM: we remove our
  socket and exit), so that the next call is served by the new code;
- reaps its workers, and exits after ``HERMES_SANDBOXES_WARM_IDLE_S`` seconds (default 300) with
  no request and no worker, or as soon as its socket was removed or replaced.

It starts no thread (it forks), and it never runs a command, starts a sandbox or reads the host
state itself: whatever a worker starts (a sandbox's init) belongs to that worker, the host process
of its call, exactly as it would belong to an in-process CLI. It starts one process ahead: the local
backend's fork server (launcher.py), which holds nothing of any sandbox; its workers inherit its
socket and fork their launchers from it (a CLI call would otherwise start a fresh interpreter for
it: ~30 ms, far more under load, on every `run` and restore). It runs with the server's uid and
capabilities (the key's), its code is among the files the stale check watches, and it ends with the
server, however the server ends (a worker still running then starts its own for what it launches).
The modules it preloads read neither the environment, the working directory, the clock nor the
pid at import (each worker gets the client's): keep it so.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import os
import select
import signal
import socket
import struct
import sys
import time

from hermes_sandboxes.cli.fastpath import warm

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

IDLE_VAR = "HERMES_SANDBOXES_WARM_IDLE_S"
IDLE_S = 300.0
LOCK_WAIT_S = 3.0  # for a server that is on its way out (stale) to let go of the key
PRELOAD = (
    "hermes_sandboxes.cli.fastpath.inprocess", "hermes_sandboxes.cli.signals", "hermes_sandboxes.cli.running",
    "hermes_sandboxes.cli.session", "hermes_sandboxes.ui.text", "hermes_sandboxes.cli.fastpath.worker",
    "hermes_sandboxes.backends.local.factory", "hermes_sandboxes.backends.local.launcher", "encodings.ascii",
    # every other command: the click application with what its commands import when they run
    "hermes_sandboxes.cli.app", "hermes_sandboxes.cli.config", "hermes_sandboxes.cli.settings_view",
    "hermes_sandboxes.backends.local.settings",
    "yaml", "rich.status", "rich.live", "rich.spinner", "click._textwrap", "glob", "ctypes.util",
    "hermes_sandboxes.backends.local.store.base", "hermes_sandboxes.backends.local.hiding",
    "hermes_sandboxes.backends.local.guest.masks", "hermes_sandboxes.backends.local.guest.forwarder",
    "hermes_sandboxes.backends.local.egress", "hermes_sandboxes.hermes.sync.leases",
    "hermes_sandboxes.backends.local.forkserver",  # (not run here: its code joins the stale check)
)
# pure computations whose result every worker would otherwise redo (cached by the function): the
# local sandbox's seccomp program (importing libseccomp and compiling it cost ~140 ms per `run`)
WARM_UP = ("hermes_sandboxes.backends.local.syscall_filter:compiled",)
_CHECK_S = 30.0  # how often an otherwise idle loop checks that its socket is still its own
SPARE_AFTER_S = 0.05  # a spare worker is forked once the server had nothing to do for this long


def main(key: str) -> None:
    os.chdir("/")
    os.umask(0o077)
    stamped = warm.stamp()
    where = warm.runtime_dir(create=True)
    if warm.key_of(stamped) != key or where is None:
        return  # not the interpreter the client is, or no safe place: nobody to serve
    lock = _lock(f"{where}/{key}.lock")
    if lock is None:
        return
    files = package_files()  # (before the imports: see the module's docstring)
    for module in PRELOAD:
        importlib.import_module(module)
    warm_up()
    server = Server(where, key, stamped, lock, files)
    _start_fork_server()  # (after the stale check's snapshot: a change to its code makes us stale)
    try:
        server.serve()
    finally:
        # no interpreter finalization: it has nothing to tear down (socket and pid file are gone,
        # the fork server ends with us), and a server stopped by SIGTERM in a loaded suite was
        # seen running on in it for over 60 s (handlers already reset, no system call: user space)
        os._exit(0)


def _start_fork_server() -> None:
    """The local backend's fork server, started ahead for the workers (one that cannot start here:
    each worker starts its own, as in-process)."""
    from hermes_sandboxes.backends.local import launcher

    with contextlib.suppress(OSError):
        launcher.start_ahead()


def warm_up() -> None:
    """Run ``WARM_UP`` (a failure is the worker's to report, as in-process), leaving no trace of
    this process's environment behind: tempfile remembers the temporary directory it chose."""
    import tempfile

    for target in WARM_UP:
        module, _, function = target.partition(":")
        with contextlib.suppress(Exception):
            getattr(importlib.import_module(module), function)()
    tempfile.tempdir = None  # (each worker chooses again, from its client's environment)


def _lock(path: str) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                return None
            time.sleep(0.05)


def idle_seconds() -> float:
    try:
        value = float(os.environ.get(IDLE_VAR, IDLE_S))
    except ValueError:
        return IDLE_S
    return value if value > 0 else IDLE_S


def package_files() -> dict[str, tuple[int, int]]:
    """mtime and size of the interpreter and of every module file of the package (``warm.PACKAGE``),
    imported or not: whatever a worker runs of ours is among them (~190 files, a stat each: ~0.5 ms
    per call, where only the ~100 the server imports cost ~0.3 ms but left a change to the others,
    which a worker imports from disk, unseen). A module added later is seen through the module that
    imports it, a module removed as a change."""
    files = [sys.executable]
    for folder, folders, names in os.walk(warm.PACKAGE):
        folders[:] = [name for name in folders if name != "__pycache__"]
        files += [os.path.join(folder, name) for name in names if name.endswith(".py")]
    return {path: seen for path in files if (seen := _seen(path)) is not None}


def _seen(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def changed(files: dict[str, tuple[int, int]]) -> bool:
    """Whether any of ``files`` changed (a stat each: ~0.2 ms, where listing them again cost ~1 ms)."""
    return any(_seen(path) != seen for path, seen in files.items())


class Server:
    def __init__(self, where: str, key: str, stamped: tuple[Any, ...], lock: int,
                 files: dict[str, tuple[int, int]]) -> None:
        self.path, self.pidfile = f"{where}/{key}.sock", f"{where}/{key}.pid"
        self.stamped, self.lock = stamped, lock
        self.idle = idle_seconds()
        self.pid = os.getpid()
        self.files = files  # (package_files(), taken before the imports)
        self.workers: set[int] = set()
        self.spare: tuple[int, socket.socket] | None = None  # (not a worker until it has a call)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a dead server's (we hold the lock)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(64)
        self.inode = os.stat(self.path).st_ino
        with open(self.pidfile + ".new", "w") as f:
            f.write(f"{os.getpid()}\n")
        os.rename(self.pidfile + ".new", self.pidfile)
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)

    def serve(self) -> None:
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a worker ended: wakes the poll up
        signal.signal(signal.SIGTERM, _exit_on_signal)
        signal.signal(signal.SIGHUP, _exit_on_signal)
        poller = select.poll()
        poller.register(self.listener.fileno(), select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        last = time.monotonic()
        try:
            while True:
                self._reap()
                now = time.monotonic()
                if self.workers:
                    last = now
                elif now - last >= self.idle:
                    return
                if not self._still_ours():
                    return
                wait = _CHECK_S if self.workers else min(_CHECK_S, self.idle - (now - last))
                if self.spare is None:
                    wait = min(wait, SPARE_AFTER_S)
                ready = {fd for fd, _ in poller.poll(max(0.0, wait) * 1000)}
                if self.wake_r in ready:
                    with contextlib.suppress(OSError):
                        os.read(self.wake_r, 4096)
                if self.listener.fileno() in ready:
                    last = time.monotonic()
                    self._accept()
                elif self.spare is None and not ready:
                    self.spare = self._fork_spare()  # a quiet moment: the next call's worker, forked ahead
        finally:
            if self.spare is not None:
                self.spare[1].close()  # it reads end-of-file and leaves
            self._remove()

    def _accept(self) -> None:
        """Hand one connection to a worker of its own."""
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        with conn:
            _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if uid != os.getuid():
                return  # (the directory is ours alone; this is the second lock on the door)
            if self.spare is not None:
                pid, handle = self.spare
                self.spare = None
                try:
                    socket.send_fds(handle, [b"c"], [conn.fileno()])
                    self.workers.add(pid)
                    return
                except OSError:  # it died: fork one now
                    pass
                finally:
                    handle.close()
            pid = os.fork()
            if pid == 0:
                self._become_worker(conn)
            self.workers.add(pid)

    def _fork_spare(self) -> tuple[int, socket.socket]:
        """A worker forked ahead, waiting for its connection on a socket pair (a fork and what the
        worker sets up next cost ~1.5 ms, off the next call's path this way)."""
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            ours.close()
            self._become_worker(None, theirs)
        theirs.close()
        return pid, ours

    def _become_worker(self, conn: socket.socket | None, handle: socket.socket | None = None) -> None:
        """In the forked child: let go of everything of the server's, then serve ``conn`` (a spare
        first waits for it on ``handle``; end-of-file there means the server left: so do we)."""
        try:
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            self.listener.close()  # a listener a worker kept would queue clients nobody answers
            for fd in (self.wake_r, self.wake_w, self.lock):  # the lock: a new server may start
                os.close(fd)
            if self.spare is not None:
                self.spare[1].close()
            from hermes_sandboxes.cli.fastpath import worker as warmworker

            if conn is None:
                assert handle is not None
                _msg, fds, _flags, _addr = socket.recv_fds(handle, 1, 1)
                handle.close()
                if len(fds) != 1:
                    return
                conn = socket.socket(fileno=fds[0])
            files = self.files
            warmworker.serve(conn, self.stamped, lambda: changed(files), self.pid)
        finally:
            os._exit(0)

    def _reap(self) -> None:
        if self.spare is not None:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(self.spare[0], os.WNOHANG)[0]:  # a spare that died (killed): another later
                    self.spare[1].close()
                    self.spare = None
        for pid in list(self.workers):
            with contextlib.suppress(ChildProcessError):
                done, _status = os.waitpid(pid, os.WNOHANG)
                if not done:
                    continue
            self.workers.discard(pid)

    def _still_ours(self) -> bool:
        try:
            return os.stat(self.path).st_ino == self.inode
        except OSError:
            return False

    def _remove(self) -> None:
        self.listener.close()
        if self._still_ours():
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        with contextlib.suppress(OSError):
            with open(self.pidfile) as f:
                mine = f.read().strip() == str(os.getpid())
            if mine:
                os.unlink(self.pidfile)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(0)
