"""Host side of starting a sandbox's init: the fork server each host process keeps, and a start.

The configuration travels on a socket, never on a command line: the init inherits its launcher's
command line, and the sandbox reads it as /proc/1/cmdline. So the command line is a fixed,
path-free bootstrap (``argv[0]`` is a name, not the interpreter's host path). To the caller's
configuration this adds the security parts every init gets: the compiled seccomp filter here, and
the paths of other sandbox stores (and loop images) to hide, which the launcher lists itself.

Starting Python and importing the init costs ~30 ms, far more on a busy machine; a start (a restore
above all) that waited for a fresh interpreter, or for one started ahead that was not ready yet,
spent most of its time there. So each host process starts one fork server (forkserver.py) on first
use and keeps it: every start forks a launcher from it. The server holds nothing of any sandbox and
exits when this process does: its end of the socket closes, and, started from the main thread, the
kernel kills it when this process dies (children we fork copy that end of the socket, and would keep
it open). The warm exec server starts its own ahead (``start_ahead``): its workers, forked from it,
inherit the socket and reuse it, as calls of one API process do; once the warm server has gone, a
worker's request fails and it starts one of its own. Whatever a caller's process state the init
inherits travels in the request (the umask), not from the fork server's.
"""

from __future__ import annotations

import marshal
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from hermes_sandboxes.backends.local import syscall_filter
from hermes_sandboxes.errors import SandboxError

_INIT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[3])
# -I: no PYTHON* variables, no user site and no current directory on sys.path; -S: no site-packages
# processing (.pth files of every installed package): the init needs only this package, whose
# parent directory is the first packet on the server's stdin.
_BOOTSTRAP = ("import marshal, os, sys; parent, owner = marshal.loads(os.read(0, 65536)); "
              "sys.path.insert(0, parent); from hermes_sandboxes.backends.local.forkserver import serve; "
              "serve(owner)")
_ARGV = ("hermes-sandboxes-init", "-I", "-S", "-c", _BOOTSTRAP)
# With an argv[0] that is no path, Python looks for its standard library (lib/python3.X/os.py and
# other landmarks) in the current directory first: started from the caller's directory, root would
# load a standard library planted there, and "/" holds the distribution's own (/lib/python3.X).
# Nobody can create anything in /proc: there Python falls back to its own prefix.
_CWD = "/proc"
_REPLY_TIMEOUT_S = 70  # the launcher gives up on its init after 60 s (forkserver)


class ForkServer:
    """One fork server process and this process's end of its request socket."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                list(_ARGV), executable=sys.executable, stdin=theirs.fileno(), stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, env=_INIT_ENV, start_new_session=True, cwd=_CWD)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.control = ours
        self.owner = os.getpid()
        # the kernel's parent-death signal follows the thread that started the child: only the main
        # thread's end is this process's (started from another thread, the socket's end alone ends it)
        bound = threading.current_thread() is threading.main_thread()
        ours.send(marshal.dumps((_PACKAGE_PARENT, self.owner if bound else None)))

    def alive(self) -> bool:
        """Whether it still runs, as far as this process can tell: a forked child (a warm worker)
        cannot wait for its parent's child; a request to a dead one fails, and is retried."""
        return self.process.poll() is None if os.getpid() == self.owner else True

    def request(self, conn: socket.socket) -> None:
        """Hand the server the socket a new launcher reads its configuration from."""
        socket.send_fds(self.control, [b"s"], [conn.fileno()], socket.MSG_NOSIGNAL)

    def close(self) -> None:
        """The server exits once its socket closes; wait for that (it is our child)."""
        self.control.close()
        self.process.wait()


_server: ForkServer | None = None
_server_lock = threading.Lock()


def start_ahead() -> None:
    """Start this process's fork server now, if it has none (the warm server, for its workers)."""
    global _server
    with _server_lock:
        if _server is None:
            _server = ForkServer()


def _umask() -> int:
    """This process's umask, read without changing it (os.umask would, for a moment, for all threads)."""
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"Umask:"):
                return int(line.split()[1], 8)
    return 0o022  # (Linux < 4.7)


def _request(conn: socket.socket) -> None:
    """Ask this process's fork server (started on first use, again if it died) for a launcher."""
    global _server
    with _server_lock:
        for attempt in (1, 2):
            if _server is None or not _server.alive():
                _server = ForkServer()
            try:
                _server.request(conn)
                return
            except OSError:  # it died after the check: once more with a new one
                _server.control.close()
                _server = None
                if attempt == 2:
                    raise


class Launch:
    """One init being started. The launcher is forked at once and told the groups, the network and
    the store: it joins those groups, makes the namespaces (a cgroup migration waits for the kernel,
    ~5-10 ms on v1) and lists what to hide (reading every loop device: milliseconds) while the caller
    gets the rest ready; finish() hands it the rest and waits for the init. A launch dropped
    unfinished (close(), or this process dying) starts nothing."""

    def __init__(self, name: str, join_dirs: list[str], network: str, store_home: Path, lower: str,
                 more: dict[str, Any] | None = None) -> None:
        """``more``: ``userns`` (the id map and mode, see userns.py), ``masks`` (paths the init
        covers inside), ``rlimits`` (resource number -> limit, set before the init starts)."""
        self.name = name
        self._conn, theirs = socket.socketpair()
        try:
            _request(theirs)
            self._conn.sendall(marshal.dumps({"cgroups": join_dirs, "network": network,
                                              "store_home": str(store_home), "lower": lower, "umask": _umask(),
                                              **(more or {})}))
        except BaseException:
            self._conn.close()
            raise
        finally:
            theirs.close()

    def finish(self, config: dict[str, Any]) -> int:
        """Start the init with ``config``; returns its host pid once it serves requests."""
        full = {**config, "package": _PACKAGE_PARENT, "seccomp": syscall_filter.compiled()}
        with self._conn as conn:
            conn.sendall(marshal.dumps(full))
            conn.shutdown(socket.SHUT_WR)
            conn.settimeout(_REPLY_TIMEOUT_S)
            answer = bytearray()
            try:
                while chunk := conn.recv(4096):
                    answer += chunk
            except TimeoutError:
                raise SandboxError(f"sandbox {self.name} failed to start: its init was not ready in "
                                   f"{_REPLY_TIMEOUT_S} s (see {config['log']})") from None
        return self._pid(answer.decode(errors="replace"), config["log"])

    def _pid(self, answer: str, log: str) -> int:
        """The init's pid from the launcher's ``pid N`` and the init's own ``ok`` (in either order)."""
        lines = answer.split("\n")
        pids = [line[4:] for line in lines if line.startswith("pid ")]
        errors = [line[6:] for line in lines if line.startswith("error ")]
        if "ok" in lines and len(pids) == 1 and pids[0].isdigit() and not errors:
            return int(pids[0])
        detail = "; ".join(errors) or ("its init died during set-up" if pids else "its launcher died")
        raise SandboxError(f"sandbox {self.name} failed to start: {detail} (see {log})")

    def close(self) -> None:
        """Give up on this launch if it is not finished (the launcher then exits)."""
        self._conn.close()
