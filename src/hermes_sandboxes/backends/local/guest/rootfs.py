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


def _mount_dev(root: str, owner: tuple[int, int] | None = None, shm_bytes: int | None = None) -> None:
    """``owner``: host ids of the sandbox's root (root mode's user namespace), who owns /dev as
    root inside always did (the proxy's forwarder makes its directory there). ``shm_bytes``: the
    size of /dev/shm (default the kernel's, half of the host's memory)."""
    dev = f"{root}/dev"
    _ensure_dir(dev)
    ids = f",uid={owner[0]},gid={owner[1]}" if owner else ""
    sc.mount("tmpfs", dev, "tmpfs", sc.MS_NOSUID | sc.MS_NOEXEC, f"mode=755,size=65536k{ids}")
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
    size = f",size={shm_bytes}" if shm_bytes else ""
    sc.mount("tmpfs", f"{dev}/shm", "tmpfs", sc.MS_NOSUID | sc.MS_NODEV, f"mode=1777{size}")
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


def _layer_fds(layers: dict[str, str], idmap_fd: int | None) -> dict[str, int] | None:
    """Descriptors of the overlay's layers: plain directories, or (``idmap_fd``) idmapped clones
    of them (upper and work share one clone of their common parent: the overlay wants them on one
    mount). None if a layer's filesystem has no idmapped mounts."""
    if idmap_fd is None:
        return {key: os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) for key, path in layers.items()}
    fds: dict[str, int] = {}
    try:
        for key, path in layers.items():
            if key == "workdir":
                continue
            fds[key] = sc.idmapped_clone(os.path.dirname(path) if key == "upperdir" else path, idmap_fd)
    except OSError:
        for fd in fds.values():
            os.close(fd)
        return None
    return fds


def _overlay_options(layers: dict[str, str], fds: dict[str, int], lower: str, idmapped: bool) -> str:
    lowers = [f"/proc/self/fd/{fds[key]}" for key in ("above", "lowerdir") if key in fds]
    lowers += ["/"] if lower == "/" and "lowerdir" not in fds else []
    if idmapped:  # upper and work below their parent's clone
        up = f"/proc/self/fd/{fds['upperdir']}"
        tail = [f"upperdir={up}/{os.path.basename(layers['upperdir'])}",
                f"workdir={up}/{os.path.basename(layers['workdir'])}"]
    else:
        tail = [f"{key}=/proc/self/fd/{fds[key]}" for key in ("upperdir", "workdir")]
    return ",".join([f"lowerdir={':'.join(lowers)}", *tail])


class _fs_ids:
    """Act on files as the host ids ``ids`` (with every capability still effective)."""

    def __init__(self, ids: tuple[int, int]) -> None:
        self.ids = ids

    def __enter__(self) -> None:
        sc.set_fs_ids(*self.ids)
        sc.raise_permitted()  # the fsuid change dropped the file capabilities

    def __exit__(self, *exc: object) -> None:
        sc.set_fs_ids(0, 0)
        sc.raise_permitted()


def _mount_overlay(merged: str, options: str, mounter: tuple[int, int] | None) -> None:
    """The overlay is mounted by host root. Over idmapped layers it must act (copy-up, its work
    directory) as an id those layers map, so it is mounted with the file-system ids of the
    sandbox's root (``mounter``): the overlay keeps the credentials it was mounted with."""
    if mounter is None:
        sc.mount("overlay", merged, "overlay", 0, options)
        return
    with _fs_ids(mounter):
        sc.mount("overlay", merged, "overlay", 0, options)


def build_and_enter(*, lower: str, upper: str, work: str, merged: str,
                    above: list[tuple[str, str, bytes, int, int, int, int, int]] | None = None,
                    idmap_fd: int | None = None, mounter: tuple[int, int] | None = None,
                    userxattr: bool = False, shm_bytes: int | None = None) -> bool:
    """Mount the overlay root at ``merged`` and make it this process's ``/``. ``above``: entries of
    a read-only layer stacked over the base, under the writable layer (trust.py's). Root mode
    (``idmap_fd``, ``mounter``: the sandbox's user namespace and the host ids of its root): the
    layers are idmapped, so the sandbox's root owns what host root owns on disk; returns False if a
    layer's filesystem cannot do that (then the layers are used as they are). Rootless
    (``userxattr``): the overlay keeps its whiteouts and opaque marks in user.* xattrs."""
    sc.mount("none", "/", None, sc.MS_REC | sc.MS_PRIVATE)  # nothing we mount leaks to the host
    _ensure_dir(merged)
    if above is not None:
        _build_layer(merged + ".above", above)
    layers = {"upperdir": upper, "workdir": work} if lower == "/" and idmap_fd is None else {
        "lowerdir": lower, "upperdir": upper, "workdir": work}
    if above is not None:
        layers["above"] = merged + ".above"
    fds = _layer_fds(layers, idmap_fd) if idmap_fd is not None else None
    idmapped = fds is not None
    if fds is None:
        if lower == "/":
            layers.pop("lowerdir", None)
        fds = _layer_fds(layers, None)
    assert fds is not None
    try:
        options = _overlay_options(layers, fds, lower, idmapped)
        if userxattr:
            sc.mount("overlay", merged, "overlay", 0, options + ",userxattr")
        else:
            _mount_overlay(merged, options, mounter if idmapped else None)
    finally:
        for fd in fds.values():
            os.close(fd)
    if idmapped and mounter is not None:  # what the mounts below need, made as the sandbox's root
        with _fs_ids(mounter):
            for name, mode in (("proc", 0o555), ("sys", 0o555), ("dev", 0o755)):
                _ensure_dir(f"{merged}/{name}", mode)
    _mount_proc(merged)
    _mount_sys(merged)
    _mount_dev(merged, mounter if idmapped else None, shm_bytes)
    os.chdir(merged)
    sc.pivot_root(".", ".")  # stacks the old root on top of the new one...
    sc.umount(".", sc.MNT_DETACH)  # ...so detaching "." leaves only the sandbox's root
    os.chdir("/")
    return idmapped


def hide(paths: list[str] | tuple[str, ...], *, follow: bool = False) -> None:
    """Cover each path that exists in the sandbox's root (entered already) with something empty: a
    read-only tmpfs over a directory, /dev/null over a file. Paths resolve inside the sandbox; a
    path the sandbox turned into a symlink is skipped, since what the host had there is hidden
    behind that symlink already. ``follow`` (a rootless sandbox's configured masks, whose base is
    the user's own tree): a path that is a symlink is hidden where it points, as root mode's masks
    are (guest/masks.py); resolved in the sandbox's root, so at worst it hides a file of its own.
    Root inside can neither unmount nor mount (capabilities, seccomp)."""
    for named in paths:
        path = os.path.realpath(named) if follow else named
        if path == "/":
            continue  # the backend refuses such a mask; one the sandbox planted hides nothing
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue
        if stat.S_ISDIR(mode):
            sc.mount("tmpfs", path, "tmpfs", sc.MS_RDONLY | sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC,
                     "mode=0755,size=4k")
        elif not stat.S_ISLNK(mode):
            sc.mount("/dev/null", path, None, sc.MS_BIND)
