"""Hide host secrets from a sandbox whose base is the host's root.

Masking is done in the sandbox's writable layer rather than with mounts: a masked directory is an
*opaque* directory in the upper layer (the sandbox sees it empty, and what it writes there is its
own, persisted and checkpointed like everything else), a masked file is a whiteout (the sandbox
sees it deleted). /etc/shadow and /etc/gshadow (and their backups, shadow- and gshadow-) keep their
user lists with every password hash replaced by ``*``, so tools that read them still work.

Other sandbox stores on the machine are hidden differently: every store records its home in a
machine-wide registry, and each init covers the homes of the others (and every file that backs a
loop device, such as a store image) with empty mounts when it starts (``hidden_from_sandboxes``,
applied by rootfs.hide). Those mounts change nothing in the layer, so a store created later never
shows up in a sandbox's diffs or checkpoints; sandboxes already running when a store is first
registered get the same mount at once (hiding.py).

A masked path is resolved first, inside the base (an absolute symlink restarts at the base's root,
as it would inside the sandbox): hiding a symlink would leave what it points to readable. The
path is masked where it resolves to, and also as named when its parent directories are real; a
path that cannot be resolved safely (a symlink loop, more than 40 links, a path resolving to the
root itself) is refused with OSError, and no sandbox starts with it.
"""

from __future__ import annotations

import _thread
import collections
import errno
import glob
import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

OPAQUE_XATTR = "trusted.overlay.opaque"

# Directories whose host content a sandbox must not see. /tmp and /var/tmp hold other programs'
# sockets and scratch files; the sandbox gets its own, empty ones.
# /var/lib/hermes-sandboxes-ids: root mode's claims of id blocks (userns.RANGE_CLAIMS), which name
# every store home and sandbox on the machine.
DEFAULT_MASKED_DIRS = ("/home", "/root", "/tmp", "/var/tmp", "/run/secrets", "/var/lib/hermes-sandboxes",
                       "/var/lib/hermes-sandboxes-ids")
# Files (globs allowed) that appear deleted inside the sandbox.
DEFAULT_MASKED_FILES = ("/etc/ssh/ssh_host_*_key", "/etc/ssh/ssh_host_*_key.pub")
SCRUBBED_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-")
# One file per store home (named by a digest of its path, holding the path): see the docstring.
STORE_REGISTRY = Path("/var/lib/hermes-sandboxes-stores")
_LOOP_DEVICES = Path("/sys/block")
_MAX_LINKS = 40  # what the kernel follows in one lookup before ELOOP


def resolve_within(lower: str, path: str) -> str:
    """``path`` (absolute, as seen inside a sandbox on ``lower``) with every symlink followed, as
    the sandbox would follow it; components that do not exist are kept as written. OSError
    (ELOOP) for a symlink loop or too many links, or a path that resolves to the root."""
    root = str(lower).rstrip("/")
    pending = collections.deque(path.split("/"))
    resolved: list[str] = []
    links = 0
    while pending:
        part = pending.popleft()
        if part in ("", "."):
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = root + "/" + "/".join([*resolved, part])
        try:
            is_link = stat.S_ISLNK(os.lstat(candidate).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            is_link = False
        if not is_link:
            resolved.append(part)
            continue
        links += 1
        if links > _MAX_LINKS:
            raise OSError(errno.ELOOP, f"cannot resolve {path}: too many symbolic links")
        target = os.readlink(candidate)
        if target.startswith("/"):
            resolved = []
        pending.extendleft(reversed(target.split("/")))
    if not resolved:
        raise OSError(errno.ELOOP, f"{path} resolves to the root directory itself")
    return "/" + "/".join(resolved)


def mask_targets(lower: str, path: str) -> list[str]:
    """Where masking ``path`` must apply: where it resolves to, and the name itself when only its
    last component may be a symlink (whiteing the link out too). Raises what resolve_within does."""
    target = resolve_within(lower, path)
    parent = os.path.dirname(os.path.normpath(path))
    named = os.path.normpath(path)
    if named != target and parent != "/" and resolve_within(lower, parent) != parent:
        return [target]  # a parent is a link: the name lives at the target, hidden there
    return list(dict.fromkeys([target, named]))


def register_store(home: Path) -> bool:
    """Record ``home`` as a sandbox store, so that every other store's sandboxes hide it. True
    when it was not registered yet (then hiding.py hides it from sandboxes running already)."""
    path = str(Path(home).resolve())
    entry = STORE_REGISTRY / hashlib.sha256(path.encode()).hexdigest()[:32]
    try:
        if entry.read_text() == path:
            return False
    except OSError:
        pass
    STORE_REGISTRY.mkdir(mode=0o700, parents=True, exist_ok=True)
    # per thread too: sandboxes created by threads of one process register the same store at once
    tmp = entry.with_name(f".{entry.name}.{os.getpid()}.{_thread.get_ident()}")
    tmp.write_text(path)
    os.replace(tmp, entry)
    return True


def registered_stores() -> list[str]:
    """Homes of every registered store that still exists (entries of removed homes are dropped).
    Read with os calls, not pathlib or glob: every launcher (a fresh fork) lists them per start."""
    homes = []
    registry = str(STORE_REGISTRY)
    try:
        names = os.listdir(registry)
    except FileNotFoundError:
        return []
    for name in names:
        if name.startswith("."):
            continue
        entry = f"{registry}/{name}"
        try:
            with open(entry, encoding="utf-8", errors="surrogateescape") as f:
                home = f.read()
        except OSError:
            continue
        if os.path.isdir(home):
            homes.append(home)
        else:
            try:  # noqa: SIM105 - contextlib would cost the fork server start-up time
                os.unlink(entry)
            except FileNotFoundError:
                pass
    return sorted(homes)


def loop_backing_files() -> list[str]:
    """Files that back a loop device (store images among them), as the host names them."""
    files = []
    devices = str(_LOOP_DEVICES)
    try:
        names = os.listdir(devices)
    except OSError:
        return []
    for name in names:
        if not name.startswith("loop"):
            continue
        try:
            with open(f"{devices}/{name}/loop/backing_file", "rb") as f:
                backing = f.read().decode(errors="surrogateescape").strip()
        except OSError:
            continue
        if backing.endswith(" (deleted)"):
            continue
        files.append(backing)
    return sorted(set(files))


def hidden_from_sandboxes(own_home: Path) -> list[str]:
    """What a sandbox of the store at ``own_home`` must not see, beyond its masks: the registry,
    every other store's home and every loop image. Its own home is masked in its layer already."""
    own = str(Path(own_home).resolve())
    paths = [str(STORE_REGISTRY), *registered_stores(), *loop_backing_files()]
    return [p for p in dict.fromkeys(paths) if p not in ("/", own) and not p.startswith(own + "/")]


def mask_paths(store_home: Path, extra: Iterable[str]) -> list[str]:
    """Every host path to hide: defaults, HERMES_HOME, the store itself, then user additions."""
    paths = list(DEFAULT_MASKED_DIRS) + list(DEFAULT_MASKED_FILES)
    hermes_home = os.environ.get("HERMES_HOME")
    if hermes_home:
        paths.append(hermes_home)
    paths.append(str(store_home))
    paths.extend(extra)
    return list(dict.fromkeys(os.path.normpath(p) for p in paths))


def apply_masks(upper: Path, lower: Path, paths: Iterable[str]) -> None:
    """Make ``paths`` (present in ``lower``) opaque or whited-out in ``upper``. Idempotent. It runs
    on every start, so past the matching it works on path strings (pathlib cost most of its time)."""
    prefix = str(lower).rstrip("/")
    up = str(upper).rstrip("/")
    hidden: list[str] = []
    for pattern in paths:
        full = prefix + "/" + pattern.lstrip("/")
        matches = glob.glob(full) if any(c in pattern for c in "*?[") else [full]
        for match in matches:
            named = "/" + str(Path(match).relative_to(lower))
            for target in mask_targets(prefix or "/", named):
                if any(target == h or target.startswith(h + "/") for h in hidden):
                    continue  # already inside a masked directory: creating it there would reveal its name
                rel = target.lstrip("/")
                try:
                    st = os.lstat(f"{prefix}/{rel}")
                except (FileNotFoundError, NotADirectoryError):
                    continue
                if stat.S_ISDIR(st.st_mode):
                    _make_opaque(up, prefix, rel)
                    hidden.append(target)
                else:
                    _whiteout(up, prefix, rel)
    for name in SCRUBBED_FILES:
        _scrub_shadow(up, prefix, name.lstrip("/"))


# The helpers below take ``upper`` and ``lower`` as path strings without a trailing slash ("" for
# the host's /) and ``rel`` as a normalised relative path ("etc/ssh/key").
def _parents_are_real_dirs(upper: str, rel: str) -> bool:
    """Whether every parent of ``rel`` that exists in ``upper`` is a real directory.

    The upper layer belongs to the sandbox, and this code runs on the host as root: a parent the
    sandbox replaced with a symlink (say /etc -> /etc/cron.d, resolved here against the host's
    root) would steer the writes below into a host directory. Such a parent also hides the base's
    path from the sandbox, so there is nothing left to mask under it. Nothing runs in the sandbox
    while masks are applied (its init is stopped), so the answer cannot change under us.
    """
    path = upper
    for part in rel.split("/")[:-1]:
        path = f"{path}/{part}"
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return True  # created below by _copy_parents, as a real directory
        if not stat.S_ISDIR(mode):
            return False
    return True


def _copy_parents(upper: str, lower: str, rel: str) -> None:
    """Create the parent directories of ``rel`` in upper with the lower's mode, owner and times,
    so the merged view of those directories does not change."""
    parts = rel.split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        sub = "/".join(parts[:depth])
        target = f"{upper}/{sub}"
        if os.path.isdir(target):
            continue
        st = os.stat(f"{lower}/{sub}")
        os.mkdir(target)
        os.chown(target, st.st_uid, st.st_gid)
        os.chmod(target, stat.S_IMODE(st.st_mode))
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))


def _make_opaque(upper: str, lower: str, rel: str) -> None:
    target = f"{upper}/{rel}"
    if not _parents_are_real_dirs(upper, rel):
        return
    if os.path.islink(target) or (os.path.exists(target) and not os.path.isdir(target)):
        return  # the sandbox replaced it with something of its own: already hides the host's
    if not os.path.exists(target):
        _copy_parents(upper, lower, rel)
        st = os.stat(f"{lower}/{rel}")
        os.mkdir(target)
        os.chown(target, st.st_uid, st.st_gid)
        os.chmod(target, stat.S_IMODE(st.st_mode))
    try:
        if os.getxattr(target, OPAQUE_XATTR, follow_symlinks=False) == b"y":
            return  # setting it again would still change the directory (its ctime)
    except OSError:
        pass
    os.setxattr(target, OPAQUE_XATTR, b"y", follow_symlinks=False)


def _whiteout(upper: str, lower: str, rel: str) -> None:
    target = f"{upper}/{rel}"
    if not _parents_are_real_dirs(upper, rel) or os.path.lexists(target):
        return
    _copy_parents(upper, lower, rel)
    os.mknod(target, stat.S_IFCHR | 0o000, os.makedev(0, 0))


def _scrub_shadow(upper: str, lower: str, rel: str) -> None:
    source, target = f"{lower}/{rel}", f"{upper}/{rel}"
    if not _parents_are_real_dirs(upper, rel) or os.path.lexists(target) or not os.path.isfile(source):
        return
    lines = []
    with open(source, errors="replace") as f:
        text = f.read()
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) > 1 and fields[1] not in ("", "*", "!", "!!", "x"):
            fields[1] = "*"
        lines.append(":".join(fields))
    _copy_parents(upper, lower, rel)
    st = os.stat(source)
    with open(target, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.chown(target, st.st_uid, st.st_gid)
    os.chmod(target, stat.S_IMODE(st.st_mode))
