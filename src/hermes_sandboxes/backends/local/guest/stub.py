"""The init's pre-positioned stub: a child that already sits in a spare freezer group and becomes
the next command.

Why: a command must be born inside its own freezer group (so a timeout or kill of the group
reaches everything it starts), and moving a process into a group takes the kernel's global
cgroup_threadgroup_rwsem for writing. After ~50 ms without any migration that lock's fast path has
gone idle, and the first writer waits for an RCU grace period: about 10 ms, against 0.02 ms back to
back. An agent's commands are seconds apart, so each one paid it. The stub pays that move in a
quiet moment (right after the init starts and after each command starts), in its own process, so
the init's loop does not wait either. On an exec the init renames the spare group to the command's
(cgroup v1 rename takes only cgroup_mutex, ~0.04 ms after idle as well) and hands the request and
the client's descriptors to the stub, which execs the command: born inside its group as before.

The stub is a fork of the init: capabilities, seccomp filter, no_new_privs and non-dumpable
(/proc/<stub> is as far out of reach of root inside as /proc/1) are the init's, and its exec gets
exactly what a posix_spawn child of the init gets. It shows in ``ps`` as ``hermes-stub`` and
holds one of the sandbox's pids; at the pids limit it is what runs the next command (it needs no
new pid), and the init makes no other until a pid is free. It takes SIGTERM like an ordinary
process: if root inside kills it, the init reaps it and uses its posix_spawn path until the next
quiet moment makes another.

Kept to the standard library: it is part of the init.
"""

from __future__ import annotations

import os
import signal
import socket
import time

from hermes_sandboxes.backends.local.guest import oomscore, protocol
from hermes_sandboxes.backends.local.guest import runner as command
from hermes_sandboxes.backends.local.guest import syscalls as sc

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Spare groups are "spare<n>": never a command's name (those are "x" and [a-z0-9]).
SPARE_PREFIX = "spare"
NAME = b"hermes-stub"
POOL_SIZE = 2  # a command and the one that follows at once (a check right after a change)
# The kernel's lock stays warm for ~50 ms after a migration: a command then takes the init's own
# path (as cheap as a rename), keeping the stubs for the first commands after a quiet spell.
WARM_S = 0.025
# How long the init's loop must be quiet before it forks stubs: a fork of the init costs ~1 ms,
# which a stream of back-to-back commands would otherwise pay each time.
QUIET_S = 0.02
_READY = b"r"


class Pool:
    """The init's ready stubs, each in a spare freezer group of its own."""

    def __init__(self, freezer_fd: int, idle_groups: set[str], usable: bool) -> None:
        self.freezer_fd, self.idle_groups, self.usable = freezer_fd, idle_groups, usable
        self.stubs: list[Stub] = []
        self.wanted = usable  # refill once per command started, not on every stub death
        self.renamed = False  # the last take renamed a group, then found its stub gone
        self.last_move = 0.0  # when the init last moved itself into a command's group
        self._count = 0

    def timeout(self) -> float | None:
        """How long the init's loop may wait before it should refill (None: nothing to do)."""
        return QUIET_S if self.wanted else None

    def take(self, group: str, message: dict[str, Any], fds: list[int]) -> int:
        """The command's pid if a stub runs it, else 0: the caller spawns it, into ``group`` that
        exists already if ``renamed``."""
        self.renamed, self.wanted = False, self.usable
        if time.monotonic() - self.last_move < WARM_S:
            return 0
        for waiting in list(self.stubs):
            ready = waiting.is_ready()
            if ready is None:
                self._drop(waiting)
            elif ready:
                break
        else:
            return 0
        try:
            os.rename(waiting.group, group, src_dir_fd=self.freezer_fd, dst_dir_fd=self.freezer_fd)
        except OSError:
            return 0  # the name is taken: the ordinary path reports it, and the stub stays spare
        self.stubs.remove(waiting)
        try:
            waiting.hand_over(message, fds)
        except OSError:  # gone or stopped by root inside: the renamed group is the command's now
            waiting.discard()
            self.renamed = True
            return 0
        return waiting.pid

    def refill(self) -> None:
        """Fork stubs up to POOL_SIZE (in a quiet moment: their own moves wait, the init does not)."""
        self.wanted = False
        while len(self.stubs) < POOL_SIZE:
            self._count += 1
            group = f"{SPARE_PREFIX}{self._count}"
            os.mkdir(group, dir_fd=self.freezer_fd)
            procs = os.open(f"{group}/cgroup.procs", os.O_WRONLY, dir_fd=self.freezer_fd)
            try:
                self.stubs.append(start(procs, group))
            except OSError:
                self.idle_groups.add(group)
                return  # at the pids limit: none until the next command starts
            finally:
                os.close(procs)

    def reaped(self, pid: int) -> None:
        """A child the init did not know as a command ended: if a stub, forget it."""
        for waiting in self.stubs:
            if waiting.pid == pid:
                self._drop(waiting)
                return

    def _drop(self, waiting: Stub) -> None:
        waiting.discard()
        self.stubs.remove(waiting)
        self.idle_groups.add(waiting.group)  # removed once the stub is reaped


class Stub:
    """The init's handle on its stub: the child's pid and the init's end of their socket pair."""

    def __init__(self, pid: int, sock: socket.socket, group: str) -> None:
        self.pid, self.sock, self.group, self.ready = pid, sock, group, False

    def is_ready(self) -> bool | None:
        """True once it sits in the spare group, False if not yet, None if it is gone or going (a
        SIGKILL pending: ``kill -9 -1`` from the command before, which the stub has not died of
        yet on a busy machine; handed a request now, it would die with it, its command never run)."""
        if not self.ready:
            try:
                said = self.sock.recv(1)
            except BlockingIOError:
                return False
            except OSError:
                return None
            if said != _READY:
                return None
            self.ready = True
        return None if _killed(self.pid) else True

    def hand_over(self, message: dict[str, Any], fds: list[int]) -> None:
        """Send the request: the stub runs it. Non-blocking, so a stub that root inside stopped
        cannot stall the init (an OSError then, and the caller starts the command itself)."""
        protocol.send(self.sock, message, fds)
        self.sock.close()

    def discard(self) -> None:
        """Kill a stub the init will not use (still its child until reaped: the pid is safe)."""
        if self.sock.fileno() >= 0:
            self.sock.close()
        try:  # noqa: SIM105 - contextlib would cost the init start-up time
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _killed(pid: int) -> bool:
    """Whether a SIGKILL is pending for ``pid`` (either set of /proc/PID/status; ~20 us)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read()
    except OSError:
        return True  # gone already
    for line in status.splitlines():
        if line.startswith((b"SigPnd:", b"ShdPnd:")) and int(line.split()[1], 16) & (1 << (signal.SIGKILL - 1)):
            return True
    return False


def start(group_procs: int, group: str) -> Stub:
    """Fork a stub that moves itself into the group whose ``cgroup.procs`` is open as
    ``group_procs``. Raises OSError (EAGAIN at the pids limit) if no process can be made."""
    mine, theirs = socket.socketpair()
    oomscore.children_first(True)  # a stub becomes a command: it is made with a command's score
    try:
        pid = os.fork()
    except OSError:
        oomscore.children_first(False)
        mine.close()
        theirs.close()
        raise
    if pid:
        oomscore.children_first(False)
    if pid == 0:
        try:
            _serve(theirs, group_procs)
        finally:
            os._exit(127)  # never back into the init's loop
    theirs.close()
    mine.setblocking(False)
    return Stub(pid, mine, group)


def _serve(sock: socket.socket, group_procs: int) -> None:
    signal.set_wakeup_fd(-1)  # the init's wake-up socket is the init's
    for sig in command.DEFAULT_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    os.setsid()
    sc.set_name(NAME)  # a prctl: /proc/self/comm of a non-dumpable process is host root's to write
    os.write(group_procs, b"0")  # the slow migration, in this process, not the init
    keep = sock.fileno()
    os.closerange(3, keep)  # nothing of the init's (listener, freezer directory, clients) stays
    os.closerange(keep + 1, 65536)
    sock.sendall(_READY)
    try:
        message, fds = protocol.recv(sock)
    except (EOFError, OSError, ValueError, protocol.ProtocolError):
        os._exit(0)  # the init discarded it or is gone
    sock.close()
    _become(message, fds)


def _become(message: dict[str, Any], fds: list[int]) -> None:
    """Do what the init's posix_spawn does for a command: its descriptors as 0, 1 and 2, a new
    session (done at start), default signal dispositions and an empty mask, then exec."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        os.close(fd)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    argv: list[str] = []
    try:
        argv, env, cwd = command.command_line(message)
        os.execve(command.enter(cwd, argv, env), argv, env)
    except command.CannotStart as exc:
        os.write(2, f"{exc.message}\n".encode())
        os._exit(exc.code)
    except OSError as exc:
        os.write(2, f"{argv[0]}: {exc.strerror}\n".encode())
        os._exit(126)
