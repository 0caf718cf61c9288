"""Build the sandbox's root filesystem inside its fresh mount namespace, then pivot into it.

Runs in the sandbox's init (PID 1 of the new pid namespace) before it serves anything. The root is
an overlay: the read-only base (the host's / or a rootfs directory) under the sandbox's writable
layer. Then a fresh /proc (with /proc/sys read-only and kernel knobs masked), a read-only /sys, and a
minimal /dev of harmless devices; the host's mounts are detached after the pivot so nothing of the
host stays reachable. The overlay's layers are named by descriptor (/proc/self/fd/N) in its mount
options, which the sandbox reads in /proc/self/mountinfo: no host path shows there.
"""

from __future__ import annotations

import os
import stat

from hermes_sandboxes.backends.local.guest import syscalls as sc

_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
_PROC_MASKED_FILES = ("kcore", "keys", "timer_list", "sysrq-trigger", "latency_stats", "sched_debug")
_PROC_READONLY_DIRS = ("sys", "bus", "fs", "irq", "acpi", "scsi")


def _ensure_dir(path: str, mode: int = 0o755) -> None:
    if not os.path.isdir(path):
        os.makedirs(path, mode=mode, exist_ok=True)


def _ro_bind(path: str) -> None:
    sc.mount(path, path, None, sc.MS_BIND | sc.MS_REC)
    sc.mount(path, path, None,
             sc.MS_BIND | sc.MS_REMOUNT | sc.MS_RDONLY | sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC)


def _mount_proc(root: str) -> None:
    proc = f"{root}/proc"
    _ensure_dir(proc, 0o555)
    sc.mount("proc", proc, "proc", sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC)
    for name in _PROC_READONLY_DIRS:
        if os.path.isdir(f"{proc}/{name}"):
            _ro_bind(f"{proc}/{name}")
    for name in _PROC_MASKED_FILES:
        if os.path.exists(f"{proc}/{name}"):
            sc.mount("/dev/null", f"{proc}/{name}", None, sc.MS_BIND)


def _mount_sys(root: str) -> None:
    sys_dir = f"{root}/sys"
    _ensure_dir(sys_dir, 0o555)
    flags = sc.MS_RDONLY | sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC
    try:
        sc.mount("sysfs", sys_dir, "sysfs", flags)
    except OSError:  # sysfs refuses a fresh mount with the host's network namespace: bind it
        sc.mount("/sys", sys_dir, None, sc.MS_BIND | sc.MS_REC)
        sc.mount(sys_dir, sys_dir, None, sc.MS_BIND | sc.MS_REMOUNT | flags)
    # Loop devices (and the other virtual block devices) say which host file backs them
    # (loop/backing_file: every store image's host path); /sys/block, /sys/class/block and
    # /sys/dev/block only link here, so one empty tmpfs hides them all, those made later too.
    virtual_block = f"{sys_dir}/devices/virtual/block"
    if os.path.isdir(virtual_block):
        sc.mount("tmpfs", virtual_block, "tmpfs", flags, "mode=0755,size=4k")


def _mount_dev(root: str) -> None:
    dev = f"{root}/dev"
    _ensure_dir(dev)
    sc.mount("tmpfs", dev, "tmpfs", sc.MS_NOSUID | sc.MS_NOEXEC, "mode=755,size=65536k")
    for name in _DEVICES:
        target = f"{dev}/{name}"
        with open(target, "w"):
            pass
        sc.mount(f"/dev/{name}", target, None, sc.MS_BIND)
    os.mkdir(f"{dev}/pts", 0o755)
    sc.mount("devpts", f"{dev}/pts", "devpts", sc.MS_NOSUID | sc.MS_NOEXEC,
             "newinstance,ptmxmode=0666,mode=0620")
    os.symlink("pts/ptmx", f"{dev}/ptmx")
    os.mkdir(f"{dev}/shm", 0o1777)
    sc.mount("tmpfs", f"{dev}/shm", "tmpfs", sc.MS_NOSUID | sc.MS_NODEV, "mode=1777")
    os.chmod(f"{dev}/shm", 0o1777)
    for link, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{link}")


def _build_layer(path: str, entries: list[tuple[str, str, bytes, int, int, int, int, int]]) -> None:
    """A tmpfs at ``path`` (private to this mount namespace) holding ``entries`` (trust.Entry:
    directories first, then files and symlinks), read-only once filled."""
    _ensure_dir(path)
    sc.mount("tmpfs", path, "tmpfs", sc.MS_NOSUID | sc.MS_NODEV, "mode=755,size=8m")
    for rel, kind, payload, mode, uid, gid, _, _ in entries:
        target = f"{path}/{rel}"
        if kind == "d":
            os.makedirs(target, exist_ok=True)
        elif kind == "f":
            with open(target, "wb") as f:
                f.write(payload)
        else:
            os.symlink(payload.decode(), target)
        os.chown(target, uid, gid, follow_symlinks=False)
        if kind != "l":
            os.chmod(target, mode)
    for rel, _kind, _, _, _, _, atime_ns, mtime_ns in reversed(entries):  # deepest first: filling moved them
        if mtime_ns:
            os.utime(f"{path}/{rel}", ns=(atime_ns, mtime_ns), follow_symlinks=False)
    sc.mount("none", path, None, sc.MS_REMOUNT | sc.MS_RDONLY | sc.MS_NOSUID | sc.MS_NODEV)


def build_and_enter(*, lower: str, upper: str, work: str, merged: str,
                    above: list[tuple[str, str, bytes, int, int, int, int, int]] | None = None) -> None:
    """Mount the overlay root at ``merged`` and make it this process's ``/``. ``above``: entries of
    a read-only layer stacked over the base, under the writable layer (trust.py's)."""
    sc.mount("none", "/", None, sc.MS_REC | sc.MS_PRIVATE)  # nothing we mount leaks to the host
    _ensure_dir(merged)
    if above is not None:
        _build_layer(merged + ".above", above)
    layers = {"upperdir": upper, "workdir": work} if lower == "/" else {
        "lowerdir": lower, "upperdir": upper, "workdir": work}
    if above is not None:
        layers["above"] = merged + ".above"
    fds = {key: os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) for key, path in layers.items()}
    try:
        lowers = [f"/proc/self/fd/{fds[key]}" for key in ("above", "lowerdir") if key in fds]
        lowers += ["/"] if lower == "/" else []
        options = ",".join([f"lowerdir={':'.join(lowers)}",
                            *(f"{key}=/proc/self/fd/{fds[key]}" for key in ("upperdir", "workdir"))])
        sc.mount("overlay", merged, "overlay", 0, options)
    finally:
        for fd in fds.values():
            os.close(fd)
    _mount_proc(merged)
    _mount_sys(merged)
    _mount_dev(merged)
    os.chdir(merged)
    sc.pivot_root(".", ".")  # stacks the old root on top of the new one...
    sc.umount(".", sc.MNT_DETACH)  # ...so detaching "." leaves only the sandbox's root
    os.chdir("/")


def hide(paths: list[str] | tuple[str, ...]) -> None:
    """Cover each path that exists in the sandbox's root (entered already) with something empty: a
    read-only tmpfs over a directory, /dev/null over a file. Paths resolve inside the sandbox; a
    path the sandbox turned into a symlink is skipped, since what the host had there is hidden
    behind that symlink already. Root inside can neither unmount nor mount (capabilities, seccomp)."""
    for path in paths:
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue
        if stat.S_ISDIR(mode):
            sc.mount("tmpfs", path, "tmpfs", sc.MS_RDONLY | sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC,
                     "mode=0755,size=4k")
        elif not stat.S_ISLNK(mode):
            sc.mount("/dev/null", path, None, sc.MS_BIND)
