"""The sandbox's init: started once per sandbox, PID 1 of its pid namespace, lives until stopped.

The launcher (forked by the fork server launcher.py keeps, told its configuration over a socket;
no host path is on the command line it inherits, which the sandbox can read as /proc/1/cmdline)
joins the sandbox's cgroups, creates the namespaces, binds the control socket at a host path, and
forks the init. The init builds the
root filesystem, drops what root inside must not have (capabilities, then a fresh session keyring,
then the seccomp filter compiled on the host by syscall_filter.py), tells the launcher it is ready
and serves requests: each ``exec`` forks a child that is placed in its own freezer cgroup
(so a timeout can kill all it starts) before it runs the command with the client's descriptors.
The launcher records the init's host pid and exits; the init outlives whoever started it, which
is what keeps background processes and persistent sandboxes alive between calls.

Idle stop (``idle_timeout``): the init itself stops the sandbox once no command a client waits for
has run for that long, so it happens with no host process of ours alive. The clock restarts at each
request and when a command ends or its client leaves; while a command's client is connected it
never runs out (a command whose host process died does not keep the sandbox up). The init then
takes the sandbox's use lock (a host file opened before the root was built) without waiting:
a host process that is about to connect holds it shared (client side: sandbox.py), so either that
request is already queued at the listener, which then cancels the stop, or the client waits for
the init to be gone and starts the sandbox again. The init writes one line to the sandbox's stop
notes (another host file; the recorder journals it as an idle stop) and exits: as PID 1 its
namespace dies with it, files and checkpoints stay.

Kept to the standard library and cheap imports: its resident memory is the idle cost of a sandbox.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import selectors
import signal
import socket
import struct
import sys
import time

from hermes_sandboxes.backends.local.guest import fileops, oomscore, protocol, rootfs, sessions, stub
from hermes_sandboxes.backends.local.guest import runner as command
from hermes_sandboxes.backends.local.guest import syscalls as sc

TYPE_CHECKING = False  # typing is not imported at run time: it slows the init's start
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# Capabilities root inside keeps (Docker's default set without CAP_MKNOD). Everything else,
# notably CAP_SYS_ADMIN (mounts), CAP_DAC_READ_SEARCH (open_by_handle_at), CAP_SYS_MODULE,
# CAP_SYS_RAWIO, CAP_SYS_PTRACE and CAP_NET_ADMIN, is dropped from the bounding set, so no
# command can regain it, setuid binaries included (no_new_privs is set as well).
KEPT_CAPABILITIES = frozenset({0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 29, 31})
_CAP_SETPCAP = 8
_CAP_NET_BIND_SERVICE = 10
_CAP_NET_RAW = 13
_EXEC_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, _SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))


def command_capabilities(host_network: bool) -> frozenset[int]:
    """What a command (and the file helper) may hold. With the host's network, raw sockets would let
    root inside read the host's traffic (loopback tokens of other programs included), and a bind to
    a privileged port would let it pose as a host service: both are dropped there too."""
    return KEPT_CAPABILITIES - {_CAP_NET_RAW, _CAP_NET_BIND_SERVICE} if host_network else KEPT_CAPABILITIES


def _drop_privileges(kept: frozenset[int], seccomp: bytes) -> None:
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        if cap not in kept and cap != _CAP_SETPCAP:
            sc.prctl(sc.PR_CAPBSET_DROP, cap)
    sc.prctl(sc.PR_SET_NO_NEW_PRIVS, 1)
    # A keyring of its own before keyctl is denied: the one inherited from whoever started the
    # launcher is the host's (the filter then keeps every keyring call out of reach anyway).
    sc.join_new_session_keyring()
    sc.load_seccomp_filter(seccomp)


def _send_quietly(conn: socket.socket, message: dict[str, Any]) -> None:
    """Send, ignoring a client that went away (contextlib would cost the init start-up time)."""
    try:  # noqa: SIM105
        protocol.send(conn, message)
    except OSError:
        pass


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def _egress_dir() -> int:
    """An O_PATH descriptor of /dev/hermes-egress (network ``proxy``), for the host process that
    starts the egress proxy: rootless, the init is not dumpable and its /proc entry is out of the
    user's reach, so the host gets the directory from here (no host directory is mounted inside).
    The last component is opened without following symlinks, as root mode's /proc/<init>/root walk."""
    dev = os.open("/dev", os.O_PATH | os.O_DIRECTORY)
    try:
        return os.open("hermes-egress", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dev)
    finally:
        os.close(dev)


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


class Init:
    # network "proxy": the forwarder's pid and how to start it again (root inside may kill it)
    forwarder_pid = 0
    start_forwarder: Callable[[], int] | None = None

    idle_timeout: float | None = None
    stops_fd = -1  # the host's stop notes, append only
    use_fd = -1  # the host's use lock of this sandbox

    def __init__(self, listener: socket.socket, freezer_fd: int, helper_caps: frozenset[int]) -> None:
        """``freezer_fd`` -1: no cgroups (rootless without delegation): a command's tree is its
        session, killed and frozen by the init itself (``kill``, ``freeze``, ``thaw``)."""
        self.listener = listener
        self.last_active = time.monotonic()
        self.helper_caps = helper_caps
        self.freezer_fd = freezer_fd
        self.home_procs = os.open("cgroup.procs", os.O_WRONLY, dir_fd=freezer_fd) if freezer_fd >= 0 else -1
        self.sel = selectors.DefaultSelector()
        self.children: dict[int, tuple[socket.socket | None, str]] = {}
        self.idle_groups: set[str] = set()
        self.sessions: dict[str, int] = {}  # exec id -> its session, without cgroups
        # A spare group is renamed into the command's: cgroup v1 only (v2 has no rename, and its
        # per-command groups keep the init's move; CLONE_INTO_CGROUP would avoid it there but
        # Python's posix_spawn does not offer it).
        self.stubs = stub.Pool(freezer_fd, self.idle_groups,
                               freezer_fd >= 0 and not _exists("cgroup.controllers", freezer_fd))

    def serve(self) -> None:
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        signal.set_wakeup_fd(wake_w.fileno())
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.sel.register(self.listener, selectors.EVENT_READ, self._accept)
        self.sel.register(wake_r, selectors.EVENT_READ, self._reap)
        while True:
            events = self.sel.select(self._timeout())
            if not events:
                self._refill()
                self._idle_check()
            for key, _ in events:
                try:
                    key.data(key.fileobj)
                except Exception as exc:  # the init outlives any request: everything depends on it
                    sys.stderr.write(f"hermes-sandboxes init: {type(exc).__name__}: {exc}\n")

    def _timeout(self) -> float | None:
        wait = self.stubs.timeout()
        if self.idle_timeout is None or self._attended():
            return wait
        left = max(0.0, self.last_active + self.idle_timeout - time.monotonic()) + 0.01
        return left if wait is None else min(wait, left)

    def _attended(self) -> bool:
        """Whether a command runs whose client is still connected (never stopped for idleness)."""
        return any(conn is not None for conn, _ in self.children.values())

    def _idle_check(self) -> None:
        timeout = self.idle_timeout
        if timeout is None or self._attended() or time.monotonic() - self.last_active < timeout:
            return
        try:
            fcntl.flock(self.use_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a host process is about to send a request: it counts as activity
            self.last_active = time.monotonic() - timeout + 1.0
            return
        if select.select([self.listener], [], [], 0)[0]:  # a request came in meanwhile
            fcntl.flock(self.use_fd, fcntl.LOCK_UN)
            return
        self.listener.close()  # held until the end: whoever waits on the lock finds no init
        note = f'{{"reason": "idle", "at": {time.time():.3f}, "idle_timeout": {timeout}}}\n'
        try:  # noqa: SIM105 - contextlib would cost the init start-up time
            os.write(self.stops_fd, note.encode())
        except OSError:
            pass
        os._exit(0)

    def _accept(self, listener: socket.socket) -> None:
        self.last_active = time.monotonic()
        conn, _ = listener.accept()
        conn.settimeout(5)
        self.sel.register(conn, selectors.EVENT_READ, self._request)

    def _close(self, conn: socket.socket) -> None:
        self.last_active = time.monotonic()
        self.sel.unregister(conn)
        conn.close()
        for pid, (c, group) in self.children.items():
            if c is conn:
                self.children[pid] = (None, group)

    def _request(self, conn: socket.socket) -> None:
        try:
            message, fds = protocol.recv(conn)
        except (EOFError, OSError, ValueError, protocol.ProtocolError):
            self._close(conn)
            return
        op = message.get("op")
        try:
            if op == "ping":
                protocol.send(conn, {"ok": True, "pid": os.getpid()})
            elif op == "egress_dir":
                dir_fd = _egress_dir()
                try:
                    protocol.send(conn, {"ok": True}, [dir_fd])
                finally:
                    os.close(dir_fd)
            elif op in ("kill", "freeze", "thaw") and self.freezer_fd < 0:
                protocol.send(conn, sessions.handle(op, message, self.sessions, self.children))
            elif op == "exec":
                pid = self._spawn(conn, message, fds)
                protocol.send(conn, {"started": pid})
                return
            else:
                protocol.send(conn, {"error": f"unknown operation {op!r}"})
        except Exception as exc:  # a malformed request fails alone; the init and its processes live on
            _send_quietly(conn, {"error": f"cannot start the command: {exc}"})
        finally:
            for fd in fds:
                os.close(fd)
        self._close(conn)

    def _spawn(self, conn: socket.socket, message: dict[str, Any], fds: list[int]) -> int:
        exec_id = str(message.get("id", ""))
        if not 0 < len(exec_id) <= 32 or not set(exec_id) <= _EXEC_ID_CHARS or len(fds) != 3:
            raise OSError(errno.EINVAL, "malformed exec request")
        group = f"x{exec_id}"
        builtin = message.get("builtin")
        if self.freezer_fd < 0:
            pid = (_fork_builtin(str(builtin), message, fds, self.helper_caps) if builtin
                   else _spawn_command(message, fds))
            self.children[pid] = (conn, group)
            sessions.remember(self.sessions, exec_id, pid)
            return pid
        pid = 0 if builtin else self.stubs.take(group, message, fds)
        if not pid:
            if not self.stubs.renamed:
                os.mkdir(group, dir_fd=self.freezer_fd)
            pid = self._spawn_inside(group, str(builtin or ""), message, fds)
            self.stubs.last_move = time.monotonic()
        self.children[pid] = (conn, group)
        return pid

    def _spawn_inside(self, group: str, builtin: str, message: dict[str, Any], fds: list[int]) -> int:
        # Init steps into the command's freezer group for the instant of the spawn, so the child
        # is born inside it: nothing it starts can run outside the group a timeout kills. This
        # move may wait ~10 ms for an RCU grace period (see stub.py): the path without a stub.
        procs = os.open(f"{group}/cgroup.procs", os.O_WRONLY, dir_fd=self.freezer_fd)
        try:
            os.write(procs, b"0")
        finally:
            os.close(procs)
        try:
            return (_fork_builtin(builtin, message, fds, self.helper_caps) if builtin
                    else _spawn_command(message, fds))
        except BaseException:
            self.idle_groups.add(group)  # removed with the other empty groups
            raise
        finally:
            os.write(self.home_procs, b"0")

    def _refill(self) -> None:
        try:
            self.stubs.refill()
        except OSError as exc:  # the init outlives it: commands take its own path
            sys.stderr.write(f"hermes-sandboxes init: cannot make a stub: {exc}\n")

    def _restart_forwarder(self) -> None:
        """A command killed the proxy forwarder (``pkill python3`` would): start another, so the
        sandbox keeps its network. Something else may hold the port by now: then it stays down."""
        assert self.start_forwarder is not None
        try:
            self.forwarder_pid = self.start_forwarder()
        except OSError as exc:
            self.forwarder_pid = 0
            sys.stderr.write(f"hermes-sandboxes init: cannot start the proxy forwarder again: {exc}\n")

    def _reap(self, wake: socket.socket) -> None:
        try:
            while wake.recv(4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            entry = self.children.pop(pid, None)
            if entry is None:
                self.stubs.reaped(pid)  # a stub killed from inside: commands take the init's path
                if pid == self.forwarder_pid and self.start_forwarder is not None:
                    self._restart_forwarder()
                continue
            conn, group = entry
            self.last_active = time.monotonic()
            if self.freezer_fd >= 0:
                self.idle_groups.add(group)
            if conn is not None:
                _send_quietly(conn, {"exit": _exit_code(status)})
                self._close(conn)
        for group in list(self.idle_groups):
            try:
                os.rmdir(group, dir_fd=self.freezer_fd)
                self.idle_groups.discard(group)
            except FileNotFoundError:
                self.idle_groups.discard(group)
            except OSError:
                pass  # a background process of that command still runs: keep its group


def _fail(fds: list[int], message: str, code: int) -> int:
    """Report a command that cannot start the way a shell would: a message on its stderr and a
    child that exits with ``code`` (so the client sees an ordinary exit, not a protocol error)."""
    os.write(fds[2], f"{message}\n".encode())
    pid = os.fork()
    if pid == 0:
        os._exit(code)
    return pid


def _spawn_command(message: dict[str, Any], fds: list[int]) -> int:
    try:
        argv, env, cwd = command.command_line(message)
        try:
            path = command.enter(cwd, argv, env)  # posix_spawn has no chdir: the child inherits ours
            # posix_spawn (vfork + exec) costs a fraction of os.fork() of this Python process.
            oomscore.children_first(True)  # inherited at the spawn (see oomscore.py)
            try:
                return os.posix_spawn(
                    path, argv, env,
                    file_actions=[(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(fds)],
                    setsid=True, setsigdef=command.DEFAULT_SIGNALS,
                )
            finally:
                oomscore.children_first(False)
        except OSError as exc:
            raise command.CannotStart(f"{argv[0]}: {exc.strerror}", 126) from None
        finally:
            os.chdir("/")
    except command.CannotStart as exc:
        return _fail(fds, exc.message, exc.code)


def _fork_builtin(name: str, message: dict[str, Any], fds: list[int], caps: frozenset[int]) -> int:
    """Run a file operation in a forked child. A fork keeps the init's full capabilities (only an
    exec applies the bounding set), so the child first cuts them to what a command gets: it can
    then do nothing root inside could not, reaching /proc/1 included. It dies after a deadline."""
    oomscore.children_first(True)
    try:
        pid = os.fork()
    except OSError:
        oomscore.children_first(False)
        raise
    if pid:
        oomscore.children_first(False)  # (never in the child: its copy of the descriptor is the init's)
    if pid == 0:
        try:
            signal.set_wakeup_fd(-1)
            for sig in command.DEFAULT_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            sc.set_capabilities(caps)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(fileops.TIMEOUT_S)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            os.closerange(3, 65536)
            os._exit(fileops.run(name, message))
        finally:
            os._exit(1)
    return pid


def _enter_user_namespace(ns_fd: int) -> None:
    """Root mode: become root of the sandbox's own user namespace (its ids are a block of host ids
    no account uses), once everything that needs host root is set up."""
    sc.setns(ns_fd, sc.CLONE_NEWUSER)
    os.setgroups([0])
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)


def _become_init(cfg: dict[str, Any], listener: socket.socket, reply: int) -> None:
    log = os.open(cfg["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(devnull)
    freezer_fd = os.open(cfg["freezer"], os.O_RDONLY | os.O_DIRECTORY) if cfg.get("freezer") else -1
    idle = cfg.get("idle_timeout")
    if idle:  # host files the idle stop needs, opened while the host's paths are in reach
        stops_fd = os.open(cfg["stops"], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        use_fd = os.open(cfg["use_lock"], os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    if cfg["network"] == "proxy":  # imported while the host's modules are still in reach (threads)
        from hermes_sandboxes.backends.local.guest import forwarder
    socket.sethostname(cfg["hostname"])
    ns_fd, ids = cfg.get("userns_fd"), cfg.get("userns") or {}
    idmapped = rootfs.build_and_enter(
        lower=cfg["lower"], upper=cfg["upper"], work=cfg["work"], merged=cfg["merged"], above=cfg.get("trust"),
        idmap_fd=ns_fd, mounter=tuple(ids["outer"]) if ns_fd is not None else None,
        userxattr=ids.get("mode") == "rootless", shm_bytes=cfg.get("shm_bytes"))
    rootfs.hide(cfg.get("hide", ()))
    rootfs.hide(cfg.get("masks", ()), follow=True)
    oomscore.hold()  # as host root still: in its user namespace the init may no longer open it
    if ids.get("refused"):
        sys.stderr.write(f"hermes-sandboxes init: no user namespace of its own ({ids['refused']}): root inside "
                         "is host root (its per-user kernel limits are shared)\n")
    # Every module the init needs is loaded: no later import may search the sandbox's files (its
    # /root could hold a planted copy of the standard library's path).
    sys.path.clear()
    sys.path_importer_cache.clear()
    if cfg["network"] in ("loopback", "proxy"):
        _loopback_up()
    if ns_fd is not None:
        if idmapped:
            _enter_user_namespace(ns_fd)
        else:
            sys.stderr.write("hermes-sandboxes init: the base's filesystem has no idmapped mounts: root inside "
                             "is host root (its per-user kernel limits are shared)\n")
        os.close(ns_fd)
    caps = command_capabilities(cfg["network"] == "host")
    _drop_privileges(caps, cfg["seccomp"])
    sc.prctl(sc.PR_SET_DUMPABLE, 0)  # /proc/1 stays out of reach of root inside (no ptrace, no fd links)
    # A signal from inside reaches PID 1 only where it has a handler: Python's for SIGINT would
    # let `kill -INT 1` end the sandbox. Ignored here; commands get the default back at spawn.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    forwarder_pid = forwarder.start() if cfg["network"] == "proxy" else 0
    try:  # noqa: SIM105 - contextlib would cost the init start-up time
        os.write(reply, b"ok\n")
    except OSError:
        pass  # the host process went away: the next start finds this init unrecorded and kills it
    os.close(reply)
    init = Init(listener, freezer_fd, caps)
    if idle:
        init.idle_timeout, init.stops_fd, init.use_fd = float(idle), stops_fd, use_fd
    if forwarder_pid:
        init.forwarder_pid, init.start_forwarder = forwarder_pid, forwarder.start
    init.serve()


def join_groups(cfg: dict[str, Any]) -> None:
    """The launcher's first step: join the groups of the new incarnation (``cgroups``)."""
    for path in cfg["cgroups"]:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write("0")


_OWN_NETWORK_SYSCTLS = (("net/ipv4/ip_unprivileged_port_start", "0"), ("net/ipv4/ping_group_range", "0 2147483647"))


def make_namespaces(cfg: dict[str, Any]) -> None:
    """Make the namespaces (``network`` says whether its own). A cgroup namespace rooted at the
    groups just joined: the host's cgroup paths stay out of /proc/self/cgroup inside, and the
    sandbox's own view of cgroups (and any cgroup mount it could make) starts below the groups
    that carry its limits. In root mode the namespaces belong to host root, not to the sandbox's
    user namespace: its root binds low ports and pings in its own network through these sysctls."""
    flags = sc.CLONE_NEWNS | sc.CLONE_NEWPID | sc.CLONE_NEWUTS | sc.CLONE_NEWIPC | sc.CLONE_NEWCGROUP
    if cfg["network"] != "host":
        flags |= sc.CLONE_NEWNET
    sc.unshare(flags)
    if cfg["network"] != "host" and (cfg.get("userns") or {}).get("mode") == "root":
        for name, value in _OWN_NETWORK_SYSCTLS:
            with open(f"/proc/sys/{name}", "w") as f:
                f.write(value)


def prepare(cfg: dict[str, Any]) -> None:
    """The launcher's first step, which needs nothing of the sandbox's files: join the groups and
    make the namespaces (see join_groups and make_namespaces)."""
    join_groups(cfg)
    make_namespaces(cfg)


def launch(configuration: Callable[[], dict[str, Any]], reply: int) -> int:
    """The launcher's second step (after prepare): forks the init at once and returns its host pid.
    The init reads the rest of its configuration itself (``configuration()``, which waits for the
    host process's second message): the fork is made while the caller gets that ready, and the
    message wakes the init directly, not a launcher that then forks it (each hand-over cost
    milliseconds of scheduling on a busy machine). The init says on ``reply`` (the host process's
    socket) ``ok`` once it serves requests, or ``error ...`` (the configuration never coming too)."""
    pid = os.fork()
    if pid == 0:
        try:
            cfg = configuration()
            _become_init(cfg, _listen(cfg["socket"]), reply)
        except BaseException as exc:  # report any failure to the host process, then die
            try:
                os.write(reply, f"error {type(exc).__name__}: {exc}\n".encode())
            finally:
                os._exit(1)
        os._exit(0)
    return pid


def _listen(path: str) -> socket.socket:
    """The init's request socket at ``path`` (one left by an earlier init replaced), owner-only."""
    if os.path.lexists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o077)
    listener.bind(path)
    os.umask(old_umask)
    listener.listen(128)
    return listener
