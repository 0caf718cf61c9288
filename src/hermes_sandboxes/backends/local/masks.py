"""Hide host secrets from a sandbox whose base is the host's root.

Masking is done in the sandbox's writable layer rather than with mounts: a masked directory is an
*opaque* directory in the upper layer (the sandbox sees it empty, and what it writes there is its
own, persisted and checkpointed like everything else), a masked file is a whiteout (the sandbox
sees it deleted). /etc/shadow and /etc/gshadow keep their user lists with every password hash
replaced by ``*``, so tools that read them still work.
"""

from __future__ import annotations

import glob
import os
import stat
from collections.abc import Iterable
from pathlib import Path

OPAQUE_XATTR = "trusted.overlay.opaque"

# Directories whose host content a sandbox must not see. /tmp and /var/tmp hold other programs'
# sockets and scratch files; the sandbox gets its own, empty ones.
DEFAULT_MASKED_DIRS = ("/home", "/root", "/tmp", "/var/tmp", "/run/secrets", "/var/lib/hermes-sandboxes")
# Files (globs allowed) that appear deleted inside the sandbox.
DEFAULT_MASKED_FILES = ("/etc/ssh/ssh_host_*_key", "/etc/ssh/ssh_host_*_key.pub")
SCRUBBED_FILES = ("/etc/shadow", "/etc/gshadow")


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
    """Make ``paths`` (present in ``lower``) opaque or whited-out in ``upper``. Idempotent."""
    prefix = str(lower).rstrip("/")
    hidden: list[str] = []
    for pattern in paths:
        if any(pattern == h or pattern.startswith(h + "/") for h in hidden):
            continue  # already inside a masked directory: creating it there would reveal its name
        full = prefix + "/" + pattern.lstrip("/")
        matches = glob.glob(full) if any(c in pattern for c in "*?[") else [full]
        for match in matches:
            host_path = Path(match)
            rel = host_path.relative_to(lower)
            try:
                st = host_path.lstat()
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                _make_opaque(upper, lower, rel)
                hidden.append("/" + str(rel))
            else:
                _whiteout(upper, lower, rel)
    for name in SCRUBBED_FILES:
        _scrub_shadow(upper, lower, Path(name.lstrip("/")))


def _parents_are_real_dirs(upper: Path, rel: Path) -> bool:
    """Whether every parent of ``rel`` that exists in ``upper`` is a real directory.

    The upper layer belongs to the sandbox, and this code runs on the host as root: a parent the
    sandbox replaced with a symlink (say /etc -> /etc/cron.d, resolved here against the host's
    root) would steer the writes below into a host directory. Such a parent also hides the base's
    path from the sandbox, so there is nothing left to mask under it. Nothing runs in the sandbox
    while masks are applied (its init is stopped), so the answer cannot change under us.
    """
    path = upper
    for part in rel.parts[:-1]:
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return True  # created below by _copy_parents, as a real directory
        if not stat.S_ISDIR(mode):
            return False
    return True


def _copy_parents(upper: Path, lower: Path, rel: Path) -> None:
    """Create the parent directories of ``rel`` in upper with the lower's mode, owner and times,
    so the merged view of those directories does not change."""
    parts = rel.parts[:-1]
    for depth in range(1, len(parts) + 1):
        sub = Path(*parts[:depth])
        target = upper / sub
        if target.is_dir():
            continue
        st = (lower / sub).stat()
        target.mkdir()
        os.chown(target, st.st_uid, st.st_gid)
        os.chmod(target, stat.S_IMODE(st.st_mode))
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))


def _make_opaque(upper: Path, lower: Path, rel: Path) -> None:
    target = upper / rel
    if not _parents_are_real_dirs(upper, rel):
        return
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        return  # the sandbox replaced it with something of its own: already hides the host's
    if not target.exists():
        _copy_parents(upper, lower, rel)
        st = (lower / rel).stat()
        target.mkdir()
        os.chown(target, st.st_uid, st.st_gid)
        os.chmod(target, stat.S_IMODE(st.st_mode))
    os.setxattr(target, OPAQUE_XATTR, b"y", follow_symlinks=False)


def _whiteout(upper: Path, lower: Path, rel: Path) -> None:
    target = upper / rel
    if not _parents_are_real_dirs(upper, rel) or os.path.lexists(target):
        return
    _copy_parents(upper, lower, rel)
    os.mknod(target, stat.S_IFCHR | 0o000, os.makedev(0, 0))


def _scrub_shadow(upper: Path, lower: Path, rel: Path) -> None:
    source, target = lower / rel, upper / rel
    if not _parents_are_real_dirs(upper, rel) or os.path.lexists(target) or not source.is_file():
        return
    lines = []
    for line in source.read_text(errors="replace").splitlines():
        fields = line.split(":")
        if len(fields) > 1 and fields[1] not in ("", "*", "!", "!!", "x"):
            fields[1] = "*"
        lines.append(":".join(fields))
    _copy_parents(upper, lower, rel)
    st = source.stat()
    target.write_text("\n".join(lines) + "\n")
    os.chown(target, st.st_uid, st.st_gid)
    os.chmod(target, stat.S_IMODE(st.st_mode))
