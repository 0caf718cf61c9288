"""Thin ctypes wrappers for the Linux calls Python 3.11's os module lacks.

Kept dependency-free and cheap to import: the sandbox init process loads this module.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal

_libc = ctypes.CDLL(None, use_errno=True)

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
CLONE_VM = 0x00000100
_SIGCHLD = 17

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4

RENAME_EXCHANGE = 2

PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
KEYCTL_JOIN_SESSION_KEYRING = 1
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276}
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91}
_SYS_CAPGET = {"x86_64": 125, "aarch64": 90}
_SYS_OPEN_TREE = {"x86_64": 428, "aarch64": 428}
_SYS_MOUNT_SETATTR = {"x86_64": 442, "aarch64": 442}
_SYS_PAUSE = {"x86_64": 34}  # (aarch64 has no pause(): clone_paused is refused there)
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = 0o2000000
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
MOUNT_ATTR_IDMAP = 0x00100000


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def mount(source: str, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {fstype or ''} {source} on {target}",
    )


def umount(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(target.encode(), ctypes.c_int(flags)), f"umount {target}")


def _syscall_number(table: dict[str, int]) -> int:
    machine = os.uname().machine
    if machine not in table:
        raise OSError(f"unsupported architecture {machine}")
    return table[machine]


def pivot_root(new_root: str, put_old: str) -> None:
    nr = _syscall_number(_SYS_PIVOT_ROOT)
    _check(_libc.syscall(ctypes.c_long(nr), new_root.encode(), put_old.encode()), "pivot_root")


def rename_exchange(a: str, b: str) -> None:
    """Atomically swap two paths on the same filesystem (renameat2 RENAME_EXCHANGE)."""
    nr = _syscall_number(_SYS_RENAMEAT2)
    at_fdcwd = -100
    _check(
        _libc.syscall(
            ctypes.c_long(nr), ctypes.c_int(at_fdcwd), a.encode(),
            ctypes.c_int(at_fdcwd), b.encode(), ctypes.c_uint(RENAME_EXCHANGE),
        ),
        f"exchange {a} and {b}",
    )


_SYNC_FILE_RANGE_WAIT_BEFORE = 1
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int) -> None:
    """Start writing the dirty pages of ``fd``'s file out (sync_file_range, not waiting for this
    write-out). It marks them clean and write-protects every shared mapping of them, so that the
    next write through a mapping faults and moves the file's ctime (a write to a page already dirty
    and writable does not). A page dirtied again while an earlier write-out of it is in flight is
    skipped by WRITE alone and would stay writable: WAIT_BEFORE waits for that write-out first."""
    flags = _SYNC_FILE_RANGE_WAIT_BEFORE | _SYNC_FILE_RANGE_WRITE
    _check(_libc.sync_file_range(fd, ctypes.c_int64(0), ctypes.c_int64(0), ctypes.c_uint(flags)), "sync_file_range")


def prctl(option: int, arg: int = 0) -> None:
    _check(
        _libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0),
                    ctypes.c_ulong(0)),
        f"prctl({option})",
    )


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def load_seccomp_filter(program: bytes) -> None:
    """Install a compiled BPF program (struct sock_filter[]) as this process's seccomp filter.
    Needs no_new_privs (or CAP_SYS_ADMIN); every child inherits it and none can remove it."""
    buf = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buf))
    _check(
        _libc.prctl(ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog),
                    ctypes.c_ulong(0), ctypes.c_ulong(0)),
        "loading the seccomp filter",
    )


def join_new_session_keyring() -> None:
    """Give this process (and all it starts) a fresh, anonymous session keyring. A kernel built
    without keyrings (ENOSYS) has nothing to share, so that is not an error."""
    nr = _syscall_number(_SYS_KEYCTL)
    result = _libc.syscall(ctypes.c_long(nr), ctypes.c_int(KEYCTL_JOIN_SESSION_KEYRING), ctypes.c_void_p(0))
    if result < 0:
        err = ctypes.get_errno()
        if err != errno.ENOSYS:
            raise OSError(err, f"keyctl(JOIN_SESSION_KEYRING): {os.strerror(err)}")


def setns(fd: int, nstype: int) -> None:
    """Move this process into the namespace ``fd`` refers to (os.setns arrives in Python 3.12)."""
    _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), "setns")


def set_capabilities(caps: frozenset[int]) -> None:
    """Make ``caps`` this process's effective and permitted sets (inheritable: none)."""
    mask = sum(1 << cap for cap in caps)
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)(mask & 0xFFFFFFFF, mask & 0xFFFFFFFF, 0, mask >> 32, mask >> 32, 0)
    nr = _syscall_number(_SYS_CAPSET)
    _check(_libc.syscall(ctypes.c_long(nr), header, data), "capset")


class _MountAttr(ctypes.Structure):
    _fields_ = (("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64))


def idmapped_clone(path: str, userns_fd: int) -> int:
    """A detached copy of the mount at ``path`` (that directory only, no submounts) whose ids are
    shown through the mapping of the user namespace ``userns_fd``: on-disk id N is inner id N there.
    Returns its descriptor (close-on-exec). OSError where the filesystem has no idmapped mounts."""
    nr = _syscall_number(_SYS_OPEN_TREE)
    fd: int = _libc.syscall(ctypes.c_long(nr), ctypes.c_int(_AT_FDCWD), path.encode(),
                       ctypes.c_uint(OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"open_tree {path}: {os.strerror(err)}")
    attr = _MountAttr(MOUNT_ATTR_IDMAP, 0, 0, userns_fd)
    nr = _syscall_number(_SYS_MOUNT_SETATTR)
    result = _libc.syscall(ctypes.c_long(nr), ctypes.c_int(fd), b"", ctypes.c_uint(_AT_EMPTY_PATH),
                           ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))
    if result != 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise OSError(err, f"idmapped mount of {path}: {os.strerror(err)}")
    return fd


_HOLDER_STACK = 1 << 14  # pause() through syscall() needs a few words of it
# looked up once, in the fork server (each launcher would otherwise look them up again)
_clone = _libc.clone
_SYSCALL = ctypes.cast(_libc.syscall, ctypes.c_void_p)


def clone_paused(flags: int) -> tuple[int, ctypes.Array[ctypes.c_char]]:
    """A child made with ``flags`` (CLONE_NEWUSER: in a new user namespace owned by this process's
    effective ids) that only waits in pause() until it is killed. It shares this process's memory
    (CLONE_VM): unlike a fork, nothing of a Python process's page tables is copied, and no page is
    copied on write afterwards. It runs no Python and no cancellable libc wrapper (those would
    write this thread's descriptor, which it shares): libc's plain syscall(SYS_pause) on a stack
    of its own. Returns its pid (reaped as a child, SIGCHLD) and that stack, which must be kept
    until it is reaped. OSError where this cannot be done (an architecture without pause()).
    It blocks every signal."""
    pause = ctypes.c_void_p(_syscall_number(_SYS_PAUSE))
    stack = ctypes.create_string_buffer(_HOLDER_STACK)
    top = ctypes.c_void_p((ctypes.addressof(stack) + _HOLDER_STACK) & ~15)
    # every signal blocked for the clone, which inherits the mask: a handler of ours run in it
    # (Python's C handler calls write(), a cancellable wrapper) would end its pause and set our
    # pending-signal flags; only SIGKILL ends it
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        pid: int = _clone(_SYSCALL, top, ctypes.c_int(flags | CLONE_VM | _SIGCHLD), pause)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"clone: {os.strerror(err)}")
    return pid, stack


def set_name(name: bytes) -> None:
    """This thread's name (what ps shows as its command name); nothing if refused."""
    _libc.prctl(ctypes.c_int(15), ctypes.c_char_p(name[:15]), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))


def set_fs_ids(uid: int, gid: int) -> None:
    """setfsuid/setfsgid (they report nothing: the caller checks what it needs)."""
    _libc.setfsgid(ctypes.c_uint(gid))
    _libc.setfsuid(ctypes.c_uint(uid))


def permitted_capabilities() -> int:
    """This process's permitted set, by capget (the init's set-up asks four times: reading
    /proc/self/status cost ~25 us each)."""
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # (effective, permitted, inheritable) of bits 0-31, then 32-63
    _check(_libc.syscall(ctypes.c_long(_syscall_number(_SYS_CAPGET)), header, data), "capget")
    return int(data[1]) | int(data[4]) << 32


def raise_permitted() -> None:
    """Make every permitted capability effective again (a change of fsuid drops the file ones)."""
    mask = permitted_capabilities()
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)(mask & 0xFFFFFFFF, mask & 0xFFFFFFFF, 0, mask >> 32, mask >> 32, 0)
    nr = _syscall_number(_SYS_CAPSET)
    _check(_libc.syscall(ctypes.c_long(nr), header, data), "capset")
