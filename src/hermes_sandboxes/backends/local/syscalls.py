"""Thin ctypes wrappers for the Linux calls Python 3.11's os module lacks.

Kept dependency-free and cheap to import: the sandbox init process loads this module.
"""

from __future__ import annotations

import ctypes
import os

_libc = ctypes.CDLL(None, use_errno=True)

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

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

_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276}


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


def prctl(option: int, arg: int = 0) -> None:
    _check(
        _libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0),
                    ctypes.c_ulong(0)),
        f"prctl({option})",
    )
