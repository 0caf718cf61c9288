"""Root mode runs each sandbox in a user namespace of its own (#24 finding 7): uid 0 inside is a
host id no account uses, one block per sandbox, so the kernel's per-user limits are not shared with
host root. The attacks: fill inotify instances and POSIX message queue bytes from inside, then host
root makes one of each (on a machine without cap_sys_resource, as this one, that failed before)."""

from __future__ import annotations

import ctypes
import errno
import os
import select
import signal
import threading
from collections.abc import Callable, Iterator

import pytest

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox, userns
from hermes_sandboxes.backends.local.guest import syscalls as sc
from tests.local.kit import new_sandbox, sh

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="root mode: the suite runs as root")

FILL_INOTIFY = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
held = []
while len(held) < 100000:
    fd = libc.inotify_init()
    if fd < 0:
        break
    held.append(fd)
print(len(held), ctypes.get_errno(), flush=True)
time.sleep(600)
"""

FILL_MQUEUE = r"""
import ctypes, os, sys, time
rt = ctypes.CDLL("librt.so.1", use_errno=True)
class Attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long),
                ("cur", ctypes.c_long), ("pad", ctypes.c_long * 4)]
rt.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(Attr)]
made = 0
while made < 10000:
    q = rt.mq_open(f"/fill{made}".encode(), os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(Attr(0, 10, 8192, 0)))
    if q < 0:
        break
    made += 1
print(made, ctypes.get_errno(), flush=True)
time.sleep(600)
"""


class _Attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long),
                ("cur", ctypes.c_long), ("pad", ctypes.c_long * 4)]


def _first_line(sb: LocalSandbox, script: str) -> Iterator[str]:
    """Start ``script`` in the background and yield its first line of output (then kill it)."""
    r, w = os.pipe()
    def out(chunk: bytes) -> None:
        os.write(w, chunk)

    proc = sb.start(["python3", "-c", script], on_stdout=out)
    try:
        assert select.select([r], [], [], 60)[0], "the filler printed nothing in 60 s"
        line = b""
        while not line.endswith(b"\n"):
            line += os.read(r, 100)
        yield line.decode().strip()
    finally:
        proc.kill()
        proc.wait(30)
        os.close(r)
        os.close(w)


@pytest.fixture
def sandbox(local_backend: LocalBackend) -> Iterator[LocalSandbox]:
    with new_sandbox(local_backend) as sb:
        yield sb


def test_root_inside_is_a_host_id_of_the_sandboxs_own_block(local_backend: LocalBackend, sandbox: LocalSandbox) -> None:
    inner = sh(sandbox, "id -u; cat /proc/self/uid_map").stdout.split()
    start = int(inner[2])
    assert inner[0] == "0" and inner[1] == "0" and inner[3] == str(userns.RANGE_SIZE)
    assert start >= userns.ROOT_RANGE_BASE and (start - userns.ROOT_RANGE_BASE) % userns.RANGE_SIZE == 0
    init_pid = int(sandbox._runtime()["pid"])  # type: ignore[index]
    with open(f"/proc/{init_pid}/status") as f:
        uids = next(line for line in f if line.startswith("Uid:")).split()[1:]
    assert uids == [str(start)] * 4, "the init runs as host root"
    # root inside still owns the base's files (idmapped layers) and changes them
    sh(sandbox, "test $(stat -c %u /etc/passwd) = 0 && echo x >> /etc/passwd && rm /usr/bin/zcat && chown 1000 /srv")
    with new_sandbox(local_backend) as other:
        assert sh(other, "cat /proc/self/uid_map").stdout.split()[1] != str(start)
        # the claims name every store and sandbox of the machine: not for a sandbox to read
        assert any(userns.RANGE_CLAIMS.iterdir())
        assert sh(other, f"ls -A {userns.RANGE_CLAIMS}").stdout == ""


def test_filling_inotify_instances_inside_leaves_host_root_its_own(sandbox: LocalSandbox) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    for line in _first_line(sandbox, FILL_INOTIFY):
        held, err = (int(n) for n in line.split())
        assert held >= 100 and err != 0, f"the filler stopped early: {line}"  # it reached the per-user limit
        fd = libc.inotify_init()
        assert fd >= 0, f"host root cannot make an inotify instance: {os.strerror(ctypes.get_errno())}"
        os.close(fd)


def test_filling_posix_message_queues_inside_leaves_host_root_its_bytes(sandbox: LocalSandbox) -> None:
    rt = ctypes.CDLL("librt.so.1", use_errno=True)
    rt.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_Attr)]
    name = f"/hs-rootless-probe-{os.getpid()}-{threading.get_ident()}".encode()
    for line in _first_line(sandbox, FILL_MQUEUE):
        made, err = (int(n) for n in line.split())
        assert made >= 5 and err != 0, f"the filler stopped early: {line}"
        q = rt.mq_open(name, os.O_CREAT | os.O_RDWR | os.O_EXCL, 0o600, ctypes.byref(_Attr(0, 10, 8192, 0)))
        assert q >= 0, f"host root cannot make a message queue: {os.strerror(ctypes.get_errno())}"
        os.close(q)
        rt.mq_unlink(name)


_NS_GET_OWNER_UID = 0xB704
_SYS_KCMP, _KCMP_VM = 312, 1


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _children() -> set[str]:
    return {pid for tid in os.listdir("/proc/self/task") for pid in _read(f"/proc/self/task/{tid}/children").split()}


def _capabilities() -> str:
    with open("/proc/self/status") as f:
        return "".join(line for line in f if line.startswith(("CapEff:", "CapPrm:")))


def _maps_inside(ns_fd: int) -> str:
    """uid_map and gid_map as a process that enters the namespace ``ns_fd`` reads them."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            sc.setns(ns_fd, sc.CLONE_NEWUSER)
            os.write(w, (_read("/proc/self/uid_map") + _read("/proc/self/gid_map")).encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r) as f:
        return f.read()


MAKERS = {"cloned (the launcher's)": userns.namespace_maker, "forked (its fallback)": userns.ForkedMaker}


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_the_sandboxs_user_namespace_is_owned_by_its_root_and_mapped_and_its_maker_leaves_nothing(
        make: Callable[[userns.IdMap], userns.ClonedMaker | userns.ForkedMaker]) -> None:
    idmap = userns.root_range_map(userns.ROOT_RANGE_SLOTS - 1)
    ids, caps, children = (os.getresuid(), os.getresgid()), _capabilities(), _children()
    maker = make(idmap)
    if make is userns.namespace_maker and os.uname().machine == "x86_64":
        assert isinstance(maker, userns.ClonedMaker), "the launcher forks its maker"
    fd = maker.take()
    maker.reap()
    try:
        owner = ctypes.c_uint(0)
        assert ctypes.CDLL(None, use_errno=True).ioctl(fd, _NS_GET_OWNER_UID, ctypes.byref(owner)) == 0
        assert owner.value == idmap.outer_uid(0), "the namespace's per-user counters would be another id's"
        assert [line.split() for line in _maps_inside(fd).splitlines()] == [
            [str(n) for n in line] for line in (*idmap.uids, *idmap.gids)]
    finally:
        os.close(fd)
    assert (os.getresuid(), os.getresgid()) == ids and _capabilities() == caps, "the maker kept another id"
    assert _children() == children, "the maker's child is left"


def test_the_namespace_holder_shares_our_memory_and_waits_until_killed() -> None:
    pid, stack = sc.clone_paused(0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        same = libc.syscall(ctypes.c_long(_SYS_KCMP), os.getpid(), pid, _KCMP_VM, 0, 0)
        if same < 0 and ctypes.get_errno() == errno.ENOSYS:
            pytest.skip("a kernel without kcmp")
        assert same == 0, "a copy of our memory (a fork): its page tables cost a Python process's"
        assert os.waitpid(pid, os.WNOHANG) == (0, 0), "it did not wait"
        # it blocks every signal: one sent to it stays pending and it waits on (SIGUSR1 would end it)
        os.kill(pid, signal.SIGUSR1)
        pending = 0  # the thread's and the process's pending sets (kill() queues on the latter)
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("SigPnd:", "ShdPnd:")):
                    pending |= int(line.split()[1], 16)
        assert pending & (1 << (signal.SIGUSR1 - 1)), "SIGUSR1 was not held pending: not blocked"
        assert os.waitpid(pid, os.WNOHANG) == (0, 0), "a signal ended its wait"
    finally:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        del stack
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
