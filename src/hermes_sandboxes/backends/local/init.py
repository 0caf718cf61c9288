"""The sandbox's init: started once per sandbox, PID 1 of its pid namespace, lives until stopped.

``python -m hermes_sandboxes.backends.local.init RUN_DIR`` (the launcher) joins the sandbox's
cgroups, creates the namespaces, binds the control socket at a host path, and forks the init. The
init builds the root filesystem, drops what root inside must not have, tells the launcher it is
ready and serves requests: each ``exec`` forks a child that is placed in its own freezer cgroup
(so a timeout can kill all it starts) before it runs the command with the client's descriptors.
The launcher records the init's host pid and exits; the init outlives whoever started it, which
is what keeps background processes and persistent sandboxes alive between calls.

Kept to the standard library and cheap imports: its resident memory is the idle cost of a sandbox.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import selectors
import signal
import socket
import struct
import sys
from typing import Any

from hermes_sandboxes.backends.local import builtins, protocol, rootfs
from hermes_sandboxes.backends.local import syscalls as sc

# Capabilities root inside keeps (Docker's default set without CAP_MKNOD). Everything else,
# notably CAP_SYS_ADMIN (mounts), CAP_DAC_READ_SEARCH (open_by_handle_at), CAP_SYS_MODULE,
# CAP_SYS_RAWIO, CAP_SYS_PTRACE and CAP_NET_ADMIN, is dropped from the bounding set, so no
# command can regain it, setuid binaries included (no_new_privs is set as well).
KEPT_CAPABILITIES = frozenset({0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 29, 31})
_CAP_SETPCAP = 8
_EXEC_ID = re.compile(r"^[a-z0-9]{1,32}$")
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, _SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))


def _drop_privileges() -> None:
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        if cap not in KEPT_CAPABILITIES and cap != _CAP_SETPCAP:
            sc.prctl(sc.PR_CAPBSET_DROP, cap)
    sc.prctl(sc.PR_SET_NO_NEW_PRIVS, 1)


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


class Init:
    def __init__(self, listener: socket.socket, freezer_fd: int) -> None:
        self.listener = listener
        self.freezer_fd = freezer_fd
        self.sel = selectors.DefaultSelector()
        self.children: dict[int, tuple[socket.socket | None, str]] = {}
        self.idle_groups: set[str] = set()

    def serve(self) -> None:
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        signal.set_wakeup_fd(wake_w.fileno())
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.sel.register(self.listener, selectors.EVENT_READ, self._accept)
        self.sel.register(wake_r, selectors.EVENT_READ, self._reap)
        while True:
            for key, _ in self.sel.select():
                key.data(key.fileobj)

    def _accept(self, listener: socket.socket) -> None:
        conn, _ = listener.accept()
        conn.settimeout(5)
        self.sel.register(conn, selectors.EVENT_READ, self._request)

    def _close(self, conn: socket.socket) -> None:
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
            elif op == "exec":
                pid = self._spawn(conn, message, fds)
                protocol.send(conn, {"started": pid})
                return
            else:
                protocol.send(conn, {"error": f"unknown operation {op!r}"})
        except OSError as exc:
            try:
                protocol.send(conn, {"error": f"cannot start the command: {exc}"})
            except OSError:
                pass
        finally:
            for fd in fds:
                os.close(fd)
        self._close(conn)

    def _spawn(self, conn: socket.socket, message: dict[str, Any], fds: list[int]) -> int:
        exec_id = str(message.get("id", ""))
        if not _EXEC_ID.match(exec_id) or len(fds) != 3:
            raise OSError(errno.EINVAL, "malformed exec request")
        group = f"x{exec_id}"
        os.mkdir(group, dir_fd=self.freezer_fd)
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(go_w)
                _child(message, fds, go_r)
            finally:
                os._exit(127)
        os.close(go_r)
        try:
            procs = os.open(f"{group}/cgroup.procs", os.O_WRONLY, dir_fd=self.freezer_fd)
            try:
                os.write(procs, str(pid).encode())
            finally:
                os.close(procs)
        except OSError:
            os.kill(pid, signal.SIGKILL)
            os.close(go_w)
            raise
        os.write(go_w, b"g")  # only now may the child run: it cannot escape its cgroup
        os.close(go_w)
        self.children[pid] = (conn, group)
        return pid

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
                continue
            conn, group = entry
            self.idle_groups.add(group)
            if conn is not None:
                try:
                    protocol.send(conn, {"exit": _exit_code(status)})
                except OSError:
                    pass
                self._close(conn)
        for group in list(self.idle_groups):
            try:
                os.rmdir(group, dir_fd=self.freezer_fd)
                self.idle_groups.discard(group)
            except FileNotFoundError:
                self.idle_groups.discard(group)
            except OSError:
                pass  # a background process of that command still runs: keep its group


def _child(message: dict[str, Any], fds: list[int], go_r: int) -> None:
    """In the forked child: wait to be placed in the cgroup, then become the command."""
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGPIPE, signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                signal.SIGQUIT, signal.SIGXFSZ, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(sig, signal.SIG_DFL)
    os.read(go_r, 1)
    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    os.closerange(3, 65536)
    builtin = message.get("builtin")
    if builtin:
        os._exit(builtins.run(str(builtin), message))
    cwd = message.get("cwd") or "/root"
    try:
        os.chdir(cwd)
    except OSError as exc:
        os.write(2, f"hermes-sandboxes: cannot use {cwd} as working directory: {exc.strerror}\n".encode())
        os._exit(1)
    shell = message.get("shell")
    if shell is not None:
        sh = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
        argv = [sh, "-c", str(shell)]
    else:
        argv = [str(a) for a in message.get("argv") or []]
    env = {str(k): str(v) for k, v in (message.get("env") or {}).items()}
    try:
        os.execvpe(argv[0], argv, env)
    except FileNotFoundError:
        os.write(2, f"{argv[0]}: command not found\n".encode())
        os._exit(127)
    except OSError as exc:
        os.write(2, f"{argv[0]}: {exc.strerror}\n".encode())
        os._exit(126)


def _become_init(cfg: dict[str, Any], listener: socket.socket, ready_w: int) -> None:
    log = os.open(cfg["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(devnull)
    freezer_fd = os.open(cfg["freezer"], os.O_RDONLY | os.O_DIRECTORY)
    socket.sethostname(cfg["hostname"])
    rootfs.build_and_enter(lower=cfg["lower"], upper=cfg["upper"], work=cfg["work"], merged=cfg["merged"])
    if cfg["network"] == "loopback":
        _loopback_up()
    _drop_privileges()
    sc.prctl(sc.PR_SET_DUMPABLE, 0)  # /proc/1 stays out of reach of root inside (no ptrace, no fd links)
    os.write(ready_w, b"ok")
    os.close(ready_w)
    Init(listener, freezer_fd).serve()


def launch(cfg: dict[str, Any]) -> int:
    """Runs in the launcher process; returns the init's host pid."""
    for path in cfg["cgroups"]:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write("0")
    flags = sc.CLONE_NEWNS | sc.CLONE_NEWPID | sc.CLONE_NEWUTS | sc.CLONE_NEWIPC
    if cfg["network"] != "host":
        flags |= sc.CLONE_NEWNET
    sc.unshare(flags)
    if os.path.lexists(cfg["socket"]):
        os.unlink(cfg["socket"])
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o077)
    listener.bind(cfg["socket"])
    os.umask(old_umask)
    listener.listen(128)
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        try:
            _become_init(cfg, listener, ready_w)
        except BaseException as exc:  # report any failure to the launcher, then die
            try:
                os.write(ready_w, f"{type(exc).__name__}: {exc}".encode())
            finally:
                os._exit(1)
        os._exit(0)
    os.close(ready_w)
    listener.close()
    answer = b""
    while chunk := os.read(ready_r, 4096):
        answer += chunk
    if answer != b"ok":
        os.kill(pid, signal.SIGKILL)
        raise RuntimeError(answer.decode(errors="replace") or "init died during set-up")
    return pid


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    try:
        pid = launch(cfg)
    except Exception as exc:
        sys.stderr.write(f"{exc}\n")
        sys.exit(1)
    sys.stdout.write(f"{pid}\n")


if __name__ == "__main__":
    main()
