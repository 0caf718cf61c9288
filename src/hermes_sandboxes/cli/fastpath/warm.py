"""The warm path's client: hand a CLI call to this user's warm server and wait for its code.

A CLI ``exec`` imports ~60 modules before it can run a command (``ls`` or ``checkpoint list`` a few
hundred: click, rich, the settings models); scripts and agents pay that per call. So a per-user
server (server.py) keeps them imported and forks one worker per call (every command but ``shell``,
which owns the terminal, and ``mcp``, a server for a whole session):
this client only connects, sends one request (argv, the environment as bytes, the umask, the
signals we ignore, ``sys.path``) with our stdin, stdout, stderr and working directory as file
descriptors, and reads back the worker's pid, then its exit code. The worker is the CLI for that
call: it writes to our descriptors itself, and records the command as the CLI in-process would.

- Only the interpreter's built-in and C modules are imported here (no json, pathlib, threading,
  signal or enum): this module is all that a warm call pays for beyond a bare ``python``.
- ``run()`` returns None whenever the command should run in-process instead: ``shell``,
  ``HERMES_SANDBOXES_WARM=0``, no safe runtime directory, no server (then one is started in the
  background for the next calls), or a server that did nothing (it was stale, it did not know the
  invocation, it did not answer within ``ANSWER_DEADLINE_S``). Nothing has run then.
- Once the worker's pid is known, SIGINT, SIGTERM and SIGHUP are passed on to it (one that came
  earlier is passed on then), so Ctrl-C, ``timeout`` and a closed terminal act as in-process (a
  SIGHUP we were started with ignored, under ``nohup``, stays ignored here as in-process). If we
  die (kill -9, SIGQUIT), the worker sees its connection close and stops the command, recorded as
  interrupted (SIGQUIT is not passed on for that reason: the in-process CLI dumped core and left
  the command running). Ctrl-Z stops only this client: the worker is not in the terminal's job, and
  stopping it would leave nobody to notice the client's death. SIGWINCH does not matter: ``exec``
  passes no terminal size (``shell`` does, and is not served warm).
- A worker that ends without an exit code (killed) is reported in one line on stderr: exit 125.

The runtime directory is ``$XDG_RUNTIME_DIR/hermes-sandboxes``, else ``/run/user/<uid>/...``, else
``/tmp/hermes-sandboxes-<uid>``: ours, mode 0700, not a symlink, or not used at all. A server is
keyed by the interpreter, the package's location, the interpreter's flags and the variables that
change how Python starts, so two checkouts or venvs never share one.
"""

from __future__ import annotations

import _socket
import marshal
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal as _signal  # (what _signal provides, as the type checker knows it)
    from collections.abc import Callable
    from typing import Any
else:
    import _signal

PROTOCOL = 1
SWITCH = "HERMES_SANDBOXES_WARM"  # "0": always in-process, never a server
ANSWER_DEADLINE_S = 5.0  # for the worker's pid; the command itself may run for hours
FORWARDED = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP)
EXIT_WORKER_LOST = 125
# the hermes_sandboxes directory (this file is hermes_sandboxes/cli/fastpath/warm.py): the stamp's package,
# the tree the server's stale check watches, and its parent is the server's sys.path[0]
PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the variables that change how an interpreter starts (its stdio encodings above all)
_START_VARS = ("LC_ALL", "LC_CTYPE", "LANG")
_NAMESPACES = ("mnt", "pid", "net", "ipc", "uts", "user", "cgroup")
_PRIME = (1 << 61) - 1
_SERVER_MODULE = "hermes_sandboxes.cli.fastpath.server"
_BOOT = ("import os, sys; os.closerange(3, 1 << 30); sys.path[0] = sys.argv[1]; "
         f"from {_SERVER_MODULE} import main; main(sys.argv[2])")


def stamp() -> tuple[Any, ...]:
    """What server and client must share: interpreter, package, flags and start-up variables, and
    what a process inherits that the worker cannot take on from a request: credentials and
    capabilities (a client that dropped CAP_SYS_ADMIN must not have a worker holding it create a
    sandbox), no_new_privs and seccomp, cgroups (sandbox groups are made under the creating process's
    own on cgroup v1), namespaces, root directory and resource limits (a sandbox's init inherits
    them). The server has its spawning client's; a client that differs gets a server of its own."""
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("PYTHON") or k in _START_VARS)
    return (PROTOCOL, sys.executable, PACKAGE, tuple(sys.flags), sorted(sys._xoptions.items()), env,
            os.getuid(), os.getgid(), os.getgroups(), _privileges(), _read("/proc/self/cgroup"),
            _read("/proc/self/limits"), [_link(f"/proc/self/ns/{ns}") for ns in _NAMESPACES], _link("/proc/self/root"))


def _privileges() -> list[bytes]:
    """The capability sets, no_new_privs and the seccomp mode of this process (/proc/self/status)."""
    return [line for line in _read("/proc/self/status").splitlines()
            if line.startswith((b"Cap", b"NoNewPrivs", b"Seccomp"))]


def _read(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def key_of(stamped: tuple[Any, ...]) -> str:
    """A short stable name for a stamp (the server compares the stamp itself): its bytes as one
    number modulo a Mersenne prime, one big-integer operation."""
    data = marshal.dumps(stamped)
    return f"{(int.from_bytes(data, 'little') % _PRIME) ^ (len(data) << 48) & 0xFFFFFFFFFFFFFFFF:016x}"


def runtime_dir(create: bool = False) -> str | None:
    """Our private directory for server sockets, or None when it is not safe to use."""
    uid = os.getuid()
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if xdg.startswith("/"):
        where = xdg.rstrip("/") + "/hermes-sandboxes"
    elif os.path.isdir(f"/run/user/{uid}"):
        where = f"/run/user/{uid}/hermes-sandboxes"
    else:
        where = f"/tmp/hermes-sandboxes-{uid}"
    try:
        st = os.lstat(where)
    except FileNotFoundError:
        if not create:
            return None
        try:
            os.mkdir(where, 0o700)
            st = os.lstat(where)
        except OSError:
            return None
    except OSError:
        return None
    private = (st.st_mode & 0o170000) == 0o040000 and st.st_uid == uid and not st.st_mode & 0o077
    return where if private else None


# the global options that take a value (the command is the first other word)
_GLOBAL_VALUES = ("--backend", "-b", "--config", "--option", "-o", "--home")
# shell owns the terminal (raw mode, window size, job control); mcp is a server for a whole agent
# session, which gains nothing from a warm start and should not live as a worker of ours
IN_PROCESS_ONLY = ("shell", "mcp")


def command_of(args: list[str]) -> str | None:
    """The subcommand ``args`` name (None: none, e.g. ``--help``), as cheaply as it can be known."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or not arg.startswith("-"):
            return None if arg == "--" else arg
        i += 2 if arg in _GLOBAL_VALUES else 1
    return None


def served_warm(args: list[str]) -> bool:
    """Whether the server may run ``args`` (every command but ``IN_PROCESS_ONLY``)."""
    return os.environ.get(SWITCH, "1") != "0" and command_of(args) not in IN_PROCESS_ONLY


def run(args: list[str]) -> int | None:
    """The exit code of ``args`` run by the warm server, or None: run it in-process."""
    if not served_warm(args):
        return None
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            return None  # a closed stdio descriptor: the in-process path knows what to do
    stamped = stamp()
    key = key_of(stamped)
    where = runtime_dir()
    if where is None:
        start_server(key)
        return None
    path = f"{where}/{key}.sock"
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            start_server(key)
            return None
        except OSError:
            return None
        return _Call(sock, path).run(stamped, args)
    finally:
        sock.close()


class _Call:
    """One request on a connected socket: send, learn the worker's pid, forward signals, wait."""

    def __init__(self, sock: _socket.socket, path: str) -> None:
        self.sock, self.path = sock, path
        self.pid: int | None = None
        self.pending: list[int] = []
        self.buffer = b""

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.pid is None:
            self.pending.append(signum)
        else:
            _quietly(os.kill, self.pid, signum)  # (if it is gone, its connection tells us so)

    def run(self, stamped: tuple[Any, ...], args: list[str]) -> int | None:
        # an ignored SIGHUP stays ignored (nohup): not passed on, so the call outlives a hang-up
        previous = {sig: _signal.signal(sig, self._on_signal) for sig in FORWARDED
                    if not (sig == _signal.SIGHUP and _signal.getsignal(sig) == _signal.SIG_IGN)}
        code: int | None = None
        try:
            code = self._exchange(stamped, args)
        finally:
            for sig, handler in previous.items():
                _signal.signal(sig, handler)
            if code is None and self.pending:  # going in-process: a signal we kept acts on us now
                os.kill(os.getpid(), self.pending[0])
        return code

    def _exchange(self, stamped: tuple[Any, ...], args: list[str]) -> int | None:
        if not self._send(stamped, args):
            return None
        self.sock.settimeout(ANSWER_DEADLINE_S)
        try:
            first = self._line()
        except TimeoutError:
            # a server that accepted and never answered (stopped, wedged): go in-process, and
            # take its socket away so that the next call starts a new one (it exits when it sees)
            _quietly(os.unlink, self.path)
            return None
        except OSError:
            return None
        if first == b"stale":  # it is exiting: its successor serves the next call
            start_server(key_of(stamped))
        if first is None or not first.startswith(b"pid "):
            return None  # 'fallback', or the server went away: nothing ran
        self.pid = int(first[4:])
        self.sock.settimeout(None)
        if not self._go():
            return None
        for signum in self.pending:
            self._on_signal(signum, None)
        self.pending.clear()
        return self._outcome()

    def _send(self, stamped: tuple[Any, ...], args: list[str]) -> bool:
        umask = os.umask(0o22)
        os.umask(umask)
        ignored = [s for s in _signal.valid_signals() if _signal.getsignal(s) == _signal.SIG_IGN]
        request: Any = (stamped, list(sys.argv), args, dict(os.environb), umask, ignored, list(sys.path))
        request = marshal.dumps(request)
        try:
            self.sock.sendall(len(request).to_bytes(4, "big") + request)
        except OSError:
            return False
        return True

    def _go(self) -> bool:
        """Tell the worker to start, handing it our stdin, stdout, stderr and working directory
        (only now: descriptors queued at a server that never accepts would keep our pipes open)."""
        try:
            cwd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2, cwd))
            self.sock.sendmsg([b"g"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        except OSError:
            return False
        finally:
            os.close(cwd)
        return True

    def _line(self) -> bytes | None:
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(256)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def _outcome(self) -> int | None:
        try:
            line = self._line()
        except OSError:
            line = None
        if line is not None and line.startswith(b"exit "):
            return int(line[5:])
        if line == b"fallback":
            return None  # the fast path declined before doing anything: the full CLI's turn
        label = "\x1b[31m\x1b[1merror:\x1b[0m" if os.isatty(2) else "error:"
        message = (f"{label} the warm exec server's worker (pid {self.pid}) ended without an exit code "
                   "(killed?); the command's end is unknown, see: hermes-sandboxes log\n")
        _quietly(os.write, 2, message.encode())
        return EXIT_WORKER_LOST


def start_server(key: str) -> None:
    """Start this key's server in the background (it exits at once if another holds the key)."""
    if os.environ.get(SWITCH, "1") == "0" or runtime_dir(create=True) is None:
        return
    argv = [sys.executable]
    for name, value in sys._xoptions.items():  # -X options (importtime, utf8...) are part of the key
        argv += ["-X", name if value is True else f"{name}={value}"]
    argv += ["-c", _BOOT, os.path.dirname(PACKAGE), key]
    actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
               (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0), (os.POSIX_SPAWN_DUP2, 1, 2)]
    _quietly(os.posix_spawn, sys.executable, argv, os.environ, file_actions=actions, setsid=True,
             setsigdef=_signal.valid_signals(), setsigmask=())


def _quietly(call: Callable[..., object], *args: object, **kwargs: object) -> None:
    """``call``, any OSError ignored (contextlib.suppress without importing contextlib)."""
    try:  # noqa: SIM105
        call(*args, **kwargs)
    except OSError:
        pass
