"""The seccomp filter every process of a local sandbox runs under, compiled with libseccomp.

The policy follows the default profile of the common container engines for a container without
CAP_SYS_ADMIN (root inside has none): a process may make every system call libseccomp knows for this
architecture except the ones below, which fail with EPERM. ``clone3`` fails with ENOSYS instead (its
flags sit in a struct a filter cannot read; ENOSYS makes the C library fall back to ``clone``, whose
flags it can), and so does every call libseccomp does not know (newer than the library), so a call
added to the kernel later is denied until it is reviewed here.

The filter is compiled on the host (here, with the ``pyseccomp`` binding of the system's
libseccomp) and handed to the sandbox's init as raw BPF: the init loads it with one prctl and never
imports libseccomp, which keeps its start-up time and memory where they were (measured on the dev
machine: importing the binding and compiling in the init cost ~65 ms and ~5 MB of RSS, since finding
the library loads subprocess and runs ldconfig; loading the exported program costs well under 1 ms).
"""

from __future__ import annotations

import errno
import functools
import tempfile
from typing import Any

from hermes_sandboxes.errors import BackendUnavailable

# Denied outright (EPERM), by why. Names libseccomp does not know on this architecture are skipped.
DENIED: dict[str, tuple[str, ...]] = {
    "namespaces and mounts (their privileges would reach limits, cgroups and the kernel)": (
        "unshare", "setns", "mount", "umount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen",
        "fsconfig", "fsmount", "fspick", "mount_setattr",
    ),
    "kernel keyrings (shared with the host and other sandboxes)": ("add_key", "keyctl", "request_key"),
    "io_uring (its own path into the kernel, around this filter)": (
        "io_uring_setup", "io_uring_enter", "io_uring_register",
    ),
    "userfaultfd (stalls the kernel at will: a building block of kernel exploits)": ("userfaultfd",),
    "kernel programs and tracing": ("bpf", "perf_event_open", "lookup_dcookie", "fanotify_init"),
    "kernel modules, kexec and reboot": (
        "init_module", "finit_module", "delete_module", "create_module", "get_kernel_syms", "query_module",
        "kexec_load", "kexec_file_load", "reboot",
    ),
    "host administration": (
        "acct", "quotactl", "quotactl_fd", "swapon", "swapoff", "syslog", "settimeofday", "stime",
        "clock_settime", "clock_adjtime", "iopl", "ioperm", "sethostname", "setdomainname", "vhangup",
    ),
    "file handles (the 'shocker' escape)": ("open_by_handle_at", "name_to_handle_at"),
    "other processes' memory and descriptors": ("kcmp", "pidfd_getfd", "process_madvise"),
    "NUMA memory policy": (
        "get_mempolicy", "set_mempolicy", "set_mempolicy_home_node", "mbind", "move_pages", "migrate_pages",
    ),
    "obsolete or unimplemented": (
        "nfsservctl", "uselib", "ustat", "sysfs", "_sysctl", "vm86", "vm86old", "afs_syscall", "tuxcall",
        "security", "putpmsg", "getpmsg", "vserver",
    ),
}
ENOSYS_CALLS = ("clone3",)
# Namespace flags clone() may not carry: NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET.
CLONE_NAMESPACE_FLAGS = 0x7E020000
# personality() values allowed (as the container engines do): Linux, and the 32-bit and
# no-randomisation variants; a query (0xffffffff) too.
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
AF_VSOCK = 40  # sockets to the hypervisor: nothing a sandbox should talk to

_HIGHEST_SYSCALL = 1024  # numbers above every architecture's table (x32 bits aside)


def denied_names() -> tuple[str, ...]:
    return tuple(name for names in DENIED.values() for name in names)


def _pyseccomp() -> Any:
    try:
        import pyseccomp  # a ctypes binding without type information (see mypy overrides)
    except (ImportError, RuntimeError) as exc:  # RuntimeError: the binding found no libseccomp
        raise BackendUnavailable(
            f"the local sandbox needs libseccomp and its Python binding ({exc}); install Debian's libseccomp2 "
            "and the hermes-sandboxes package's dependencies (pyseccomp)") from exc
    return pyseccomp


@functools.cache
def compiled() -> bytes:
    """The filter as a BPF program (struct sock_filter array, native byte order). Cached: the
    policy is fixed, so every sandbox this process starts gets the same program."""
    sc = _pyseccomp()
    special = {*denied_names(), *ENOSYS_CALLS, "clone", "personality", "socket"}
    flt = sc.SyscallFilter(sc.ERRNO(errno.ENOSYS))
    flt.set_attr(sc.Attr.ACT_BADARCH, sc.ERRNO(errno.ENOSYS))  # 32-bit and x32 calls: none
    flt.set_attr(sc.Attr.CTL_NNP, 0)  # the init sets no_new_privs itself, before loading
    flt.set_attr(sc.Attr.CTL_OPTIMIZE, 2)  # a binary tree: a few comparisons per call, not hundreds
    for number in range(_HIGHEST_SYSCALL):
        try:
            name = sc.resolve_syscall(sc.Arch.NATIVE, number).decode()
        except ValueError:
            continue  # no such call on this architecture, or newer than libseccomp
        if name not in special:
            flt.add_rule(sc.ALLOW, number)
    for name in denied_names():
        _add_if_known(sc, flt, sc.ERRNO(errno.EPERM), name)
    # ENOSYS_CALLS get no rule: the default action (ENOSYS) answers them
    # Calls allowed with some arguments only. A clone with a namespace flag gets EPERM (one rule
    # per flag: rules are ORed); a personality outside the list gets the default, ENOSYS
    # (libseccomp takes one comparison per argument in a rule, so "none of these" has no rule).
    flt.add_rule(sc.ALLOW, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_NAMESPACE_FLAGS, 0))
    for bit in (1 << n for n in range(32) if CLONE_NAMESPACE_FLAGS & (1 << n)):
        flt.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, bit, bit))
    for value in PERSONALITIES:
        flt.add_rule(sc.ALLOW, "personality", sc.Arg(0, sc.EQ, value))
    flt.add_rule(sc.ALLOW, "socket", sc.Arg(0, sc.NE, AF_VSOCK))
    flt.add_rule(sc.ERRNO(errno.EPERM), "socket", sc.Arg(0, sc.EQ, AF_VSOCK))
    with tempfile.TemporaryFile() as out:
        flt.export_bpf(out)
        out.seek(0)
        program = out.read()
    if not program or len(program) % 8:
        raise BackendUnavailable(f"libseccomp exported a malformed filter ({len(program)} bytes)")
    return program


def _add_if_known(sc: Any, flt: Any, action: int, name: str) -> None:
    if sc.resolve_syscall(sc.Arch.NATIVE, name) >= 0:
        flt.add_rule(action, name)


def unavailable_reason() -> str | None:
    """Why no filter can be built here, or None (for the backend's availability check)."""
    try:
        compiled()
    except BackendUnavailable as exc:
        return str(exc)
    except OSError as exc:
        return f"libseccomp could not build the sandbox's syscall filter: {exc}"
    with open("/proc/self/status") as f:
        if "Seccomp_filters:" not in f.read():
            return "this kernel cannot filter system calls (no seccomp filter mode)"
    return None
